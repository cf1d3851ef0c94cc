"""The method (numpy/scipy only): low-rank type, decompositions, discrimination, energy and module naming,
diagnostics, file formats, adapters, erase."""
