"""The Patcher: collects declarations, plans them into entries and drives the
install layer; its configuration and the report's sources.
"""
