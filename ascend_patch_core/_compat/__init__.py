"""The DrivingSDK patcher's names: 1.0 function-style patches, per-patch and
per-group apply(), the mx_driving helper functions.
"""
