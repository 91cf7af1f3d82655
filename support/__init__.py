"""Shared support: located diagnostics, safe file output, generic IR helpers."""
