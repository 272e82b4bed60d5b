"""What crosses a network: hosts made of network namespaces, links that drop packets silently."""
