"""Developer tools for the CUDA kernels, outside the runtime (nothing that serves
imports them): ptx.py compiles every kernel for a compute capability without a GPU
(`python -m tinypaged.kernels.cuda.tools.ptx`), resources.py reads ptxas's figures
and computes occupancy, step_model.py predicts a decode step's time from the card's
measured costs."""
