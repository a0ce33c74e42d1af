"""The largest numbers the planner takes, each stated once beside its constant.

Flags, job configs and the Python API refuse a number above its limit with one line that names
it, instead of overflowing while the model is built or writing `Infinity` into a plan. Plain
constants, no imports: the CLI's argument parsing reads them before torch is loaded.
"""

# ranks of one simulated cluster (a mesh's sizes multiplied), and so also the largest degree
MAX_MESH_RANKS = 1 << 16
# tokens per sequence: 16M, above the longest context any TorchTitan model is built for
MAX_SEQ_LEN = 1 << 24
# sequences per data-parallel rank and step
MAX_LOCAL_BATCH = 1 << 16
# memory per device, in GiB: 1 PiB, far above any device
MAX_MEMORY_BUDGET_GIB = float(1 << 20)
