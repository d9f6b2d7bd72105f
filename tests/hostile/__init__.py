"""Hostile stores: crafted contents, planted files, other users, hostile URLs (issue #22)."""
