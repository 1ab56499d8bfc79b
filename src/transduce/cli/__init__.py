"""The ``transduce`` command: a thin shell over the Python API."""
