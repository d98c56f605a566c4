"""Putting replacements into their slots and taking them out again, one entry
at a time, as target modules are imported (the Installer and its helpers).
"""
