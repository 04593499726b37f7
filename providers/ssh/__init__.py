"""Owned GPU machines reached over SSH: the transport (`providers/ssh/transport.py`) connects with
host keys checked against a known_hosts file, runs commands and writes files."""
