"""CNI spec types: versions, errors with their codes, results and their conversion.

Standard library only: the thin executables import this package.
"""
