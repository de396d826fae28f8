"""The export pipeline, in order: load, decompose, convert, static trace, validate, write.

`export.py` runs the stages in that order; each stage is a module of this package: `load`,
`decompose`, `convert`, `static`, `validate`, `write` (and `fallback` when decomposition fails).
"""
