"""The command line: one thin module per ``echo-tune`` command over the library API (``main`` parses and
dispatches; ``common`` holds the flags several commands share).
"""
