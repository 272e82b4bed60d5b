"""``python -m benchmarks.report``: write RESULTS.md and the chart."""

from benchmarks.report.document import main

main()
