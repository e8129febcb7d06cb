"""json-output-keys assertion plugin for attest-engine.

`logic` holds the plugin logic (plain Python, unit-tested with pytest);
`app` is the WIT glue that componentize-py wraps into a component.
Importing this package imports neither, so tests need no WIT bindings.
"""
