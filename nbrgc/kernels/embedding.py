"""Token + position embedding, forward and backward: serial kernels.

Each is one pass over B*T*d elements, next to the blocks' GEMMs with d times the work, and below
:data:`nbrgc.kernels.serial.SERIAL_WORK` (demo, small) a parallel form ran serially anyway. As
``parallel=True`` kernels they cost a cold start about 2 s of compiling each (the parfor passes,
the gufunc and its two wrappers); serial, they give the same bits: every element is one sum in
(batch, position) order either way.
"""
from numba import njit


@njit(nogil=True, cache=True, error_model="numpy")
def embedding_fwd(tokens, wte, wpe, out):
    """tokens (B, T) -> out (B*T, d) = wte[token] + wpe[position]."""
    B, T = tokens.shape
    D = wte.shape[1]
    for n in range(B * T):
        b = n // T
        t = n % T
        tok = tokens[b, t]
        for j in range(D):
            out[n, j] = wte[tok, j] + wpe[t, j]


@njit(nogil=True, cache=True, error_model="numpy")
def embedding_bwd(tokens, dout, dwte, dwpe):
    """dwte[token] += dout, dwpe[t] += sum over batch."""
    B, T = tokens.shape
    D = dout.shape[1]
    for b in range(B):
        for t in range(T):
            tok = tokens[b, t]
            n = b * T + t
            te, pe, g = dwte[tok], dwpe[t], dout[n]  # 0-based views vectorise
            for j in range(D):
                te[j] += g[j]
                pe[j] += g[j]
