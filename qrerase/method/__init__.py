"""The method (numpy/scipy only): low-rank type, decompositions, discrimination, energy and module names,
diagnostics, file formats, adapters, erase."""
