"""Finding plugins: entry points, distribution metadata and its cache,
requirements, the hook specifications. Below the install layer and the engine.
"""
