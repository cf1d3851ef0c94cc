"""Every table and figure of the paper's layout."""
