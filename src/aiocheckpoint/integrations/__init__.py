"""Adapters that put aiocheckpoint's stores behind other frameworks' checkpoint APIs.

Each adapter is a subpackage with its own optional dependency (an extra); importing
:mod:`aiocheckpoint` or this package never imports any framework.
"""
