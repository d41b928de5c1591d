"""Token + position embedding; the backward scatters by column block so threads never collide."""
from numba import njit, prange

from .serial import LIGHT, restore_threads, serial_below


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def embedding_fwd(tokens, wte, wpe, out):
    """tokens (B, T) -> out (B*T, d) = wte[token] + wpe[position]."""
    B, T = tokens.shape
    D = wte.shape[1]
    prev = serial_below(B * T * D // LIGHT)
    for n in prange(B * T):
        b = n // T
        t = n % T
        tok = tokens[b, t]
        for j in range(D):
            out[n, j] = wte[tok, j] + wpe[t, j]
    restore_threads(prev)


@njit(parallel=True, nogil=True, cache=True, error_model="numpy")
def embedding_bwd(tokens, dout, dwte, dwpe, nt):
    """dwte[token] += dout, dwpe[t] += sum over batch; column blocks in parallel."""
    B, T = tokens.shape
    D = dout.shape[1]
    nb = max(1, min(nt, D // 8))
    step = (D + nb - 1) // nb
    prev = serial_below(B * T * D // LIGHT)
    for blk in prange(nb):
        s = blk * step
        e = min(D, s + step)
        for b in range(B):
            for t in range(T):
                tok = tokens[b, t]
                n = b * T + t
                te, pe, g = dwte[tok, s:e], dwpe[t, s:e], dout[n, s:e]  # 0-based views vectorise
                for j in range(e - s):
                    te[j] += g[j]
                    pe[j] += g[j]
    restore_threads(prev)
