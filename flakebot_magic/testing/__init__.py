"""Test doubles for the seams that cannot be reached offline.

Everything here is a *test double* and says so wherever it shows:
``fake_openai`` is a scripted stand-in for a language model, ``fake_cratesio``
a stand-in for crates.io. Both speak the real protocol over real HTTP on
127.0.0.1.
"""
