"""The built tools by name: list, show, logs, stop, clean, doctor, export, cargo; the install transaction."""
