"""The vocabulary every layer shares: patches, records and reports, target paths,
errors, values, environment flags, plain-text tables. Imports nothing of the core.
"""
