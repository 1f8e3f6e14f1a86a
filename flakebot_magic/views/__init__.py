"""What front ends show of a run: the live widget, its rows, the record a cell keeps, plain-text progress."""
