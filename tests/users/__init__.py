"""What users bring: the column types, handlers, sessions and deployments of real
applications, each crossed with every path and dialect, generated rather than hand-listed."""
