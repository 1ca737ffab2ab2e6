"""HTML reports (the only package that imports altair)."""
