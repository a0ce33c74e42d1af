"""Plan -> running program.

`interpret.py` runs the plan's joint graph on DTensors and records, with make_fx, the per-rank
program of local ops and functional collectives; `partition.py` splits that program into a
forward and a backward graph; `module.py` puts DTensor parameters on the model and runs the two
graphs under autograd; `init.py` makes the model's own weight initialisation give the same full
parameters as on one device; `regions_run.py` runs manual regions (MoE blocks) eagerly inside the program.
"""
