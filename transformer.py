"""transformer.py: attention and a GPT-style language model, built from tinytorch ops.

  1. scaled dot-product attention: softmax(q k^T / sqrt(d) + mask) v
  2. attention modules: a single head (read this first), then multi-head causal
     self-attention (with its key/value cache for generation)
  3. the Transformer block (pre-LayerNorm, GELU MLP) and the GPT model, with generate
  4. the fused attention kernel (speed; nothing above needs it to be understood)

scaled_dot_product_attention is matmul, masked_fill and softmax from tinytorch.py,
so its gradient comes from theirs. fused_causal_attention (section 4) computes the
same thing as one op with a hand-derived backward rule (faster; a test proves they
agree), and it is what CausalSelfAttention uses unless tt.fast is False (the one speed
switch: TINYTORCH_PLAIN=1).
Needs only NumPy, tinytorch.py and nn.py.
"""
import math
from dataclasses import asdict, dataclass

import tinytorch as tt
import numpy as np

import nn
from nn import _causal_mask, attention_weights  # attention's weights live in nn.py (section 4)
from tinytorch import no_grad

# ---------------------------------------------------------------------------
# 1. Scaled dot-product attention
# ---------------------------------------------------------------------------
def scaled_dot_product_attention(q, k, v, mask=None, is_causal=False):
    """q: (..., Tq, d), k: (..., Tk, d), v: (..., Tk, dv) -> (..., Tq, dv)."""
    return attention_weights(q, k, mask, is_causal) @ v


# ---------------------------------------------------------------------------
# 2. Attention modules
# ---------------------------------------------------------------------------
class Head(nn.Module):
    """One causal self-attention head, spelled out: each position asks a query,
    every earlier position offers a key and a value, and the answer is the
    values averaged with weights softmax(query . key / sqrt(head_size))."""

    def __init__(self, n_embd, head_size, bias=True):
        self.query = nn.Linear(n_embd, head_size, bias=bias)
        self.key = nn.Linear(n_embd, head_size, bias=bias)
        self.value = nn.Linear(n_embd, head_size, bias=bias)

    def forward(self, x):  # x: (B, T, C) -> (B, T, head_size)
        return scaled_dot_product_attention(self.query(x), self.key(x), self.value(x),
                                            is_causal=True)


class KVCache:
    """Keys and values already computed for earlier positions, one pair per layer,
    so that generating a new token only computes that token's query, key and value."""

    def __init__(self, n_layer):
        self.layers = [None] * n_layer  # each: (k, v) tensors of shape (B, H, T, D)

    @property
    def length(self):
        return 0 if self.layers[0] is None else self.layers[0][0].shape[2]


class CausalSelfAttention(nn.Module):
    """All heads at once: one Linear makes q, k and v for every head, the heads are
    split off the channel dim with reshape + transpose, attend independently, and
    are put back side by side before the output projection."""

    def __init__(self, config):
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd ({config.n_embd}) must be a multiple of n_head "
                             f"({config.n_head})")
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, cache=None, layer=0):
        qkv = self.c_attn(x)
        if tt.fast and cache is None:  # attend()'s numbers as one op (section 4)
            p = self.attn_dropout.p if self.training else 0.0
            y = fused_causal_attention(qkv, self.n_head, p)
        else:
            y = self.attend(qkv, cache, layer)
        return self.resid_dropout(self.c_proj(y))

    def attend(self, qkv, cache=None, layer=0):
        """The heads' causal attention on the (B, T, 3C) q/k/v projection, with engine ops."""
        B, T, C3 = qkv.shape
        H, C = self.n_head, C3 // 3
        q, k, v = qkv.split(C, dim=2)
        # (B, T, C) -> (B, T, H, C/H) -> (B, H, T, C/H): each head is a separate "batch"
        q = q.reshape(B, T, H, C // H).transpose(1, 2)
        k = k.reshape(B, T, H, C // H).transpose(1, 2)
        v = v.reshape(B, T, H, C // H).transpose(1, 2)
        past = 0
        if cache is not None:
            if cache.layers[layer] is not None:
                past_k, past_v = cache.layers[layer]
                past = past_k.shape[2]
                k, v = tt.cat([past_k, k], dim=2), tt.cat([past_v, v], dim=2)
            cache.layers[layer] = (k, v)
        w = attention_weights(q, k, mask=_causal_mask(T, past + T, past))
        y = self.attn_dropout(w) @ v  # (B, H, T, C/H)
        return y.transpose(1, 2).reshape(B, T, C)  # heads side by side again


# ---------------------------------------------------------------------------
# 3. Block and GPT
# ---------------------------------------------------------------------------
@dataclass
class GPTConfig:
    vocab_size: int = 65
    block_size: int = 64  # the longest context the model sees (learned positions)
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True  # the output head shares the token embedding matrix

    def to_dict(self):
        return asdict(self)


class MLP(nn.Module):
    def __init__(self, config):
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-LayerNorm block: x + attn(ln(x)), then x + mlp(ln(x)). The residual
    additions give the gradient a direct path back to the embeddings."""

    def __init__(self, config):
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x, cache=None, layer=0):
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)  # token embeddings
        self.wpe = nn.Embedding(config.block_size, config.n_embd)  # position embeddings
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.wte.weight
        # GPT-2 initialisation: N(0, 0.02) for every matrix, zero biases, and the
        # projections that write into the residual stream scaled by 1/sqrt(2 n_layer)
        # so the residual sum does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * config.n_layer))
            elif p.ndim == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith('bias'):
                nn.init.zeros_(p)

    def extra_repr(self):
        return f"{self.num_parameters():,} parameters"

    def forward(self, idx, targets=None, cache=None):
        """idx: (B, T) token ids. Returns (logits (B, T, vocab), loss or None)."""
        idx = idx if isinstance(idx, tt.Tensor) else tt.tensor(idx)
        B, T = idx.shape
        start = 0 if cache is None else cache.length
        if start + T > self.config.block_size:
            raise ValueError(f"GPT: a sequence of {start + T} tokens is longer than the block "
                             f"size {self.config.block_size}")
        pos = tt.arange(start, start + T)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C) + (T, C) broadcasts over B
        for i, block in enumerate(self.h):
            x = block(x, cache, i)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            targets = targets if isinstance(targets, tt.Tensor) else tt.tensor(targets)
            loss = nn.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))
        return logits, loss

    @no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_cache=True):
        """Extend idx (B, T) by max_new_tokens sampled tokens.

        With the cache, each new token runs the model on one position only. The
        context is the last block_size tokens (it slides, as in nanoGPT). Once the
        text is longer than block_size, the window moves by one token every step,
        so every token's learned position embedding changes and the cached keys and
        values no longer match: the cache is then rebuilt from the window each step.
        Both paths therefore give exactly the logits (and, for the same seed, the
        tokens) that generation without the cache gives.
        temperature=0 picks the most likely token (greedy).
        """
        idx = idx if isinstance(idx, tt.Tensor) else tt.tensor(idx)
        was_training = self.training
        self.eval()
        bs = self.config.block_size
        cache = None
        for _ in range(max_new_tokens):
            window = idx if idx.shape[1] <= bs else idx[:, -bs:]
            if not use_cache:
                logits, _ = self(window)
            elif cache is None or idx.shape[1] > bs:  # (re)build: encode the whole window
                cache = KVCache(self.config.n_layer)
                logits, _ = self(window, cache=cache)
            else:  # only the newest token is new: one position through the model
                logits, _ = self(idx[:, -1:], cache=cache)
            logits = logits.array[:, -1, :]
            if temperature == 0:
                nxt = np.argmax(logits, axis=-1)[:, None]
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = np.sort(logits, axis=-1)[:, [-min(top_k, logits.shape[-1])]]
                    logits = np.where(logits < kth, -np.inf, logits)
                probs = tt.softmax(tt.tensor(logits), -1)
                nxt = tt.multinomial(probs, num_samples=1).array
            idx = tt.tensor(np.concatenate([idx.array, nxt.astype(idx.dtype)], axis=1))
        self.train(was_training)
        return idx


# ---------------------------------------------------------------------------
# 4. The fused attention kernel (speed: the same numbers as the composed ops above)
# ---------------------------------------------------------------------------
_causal_bias_cache = {}


def _causal_bias_keys_first(t, like):
    """(t, t) additive mask indexed [key, query]: 0 where a query may look at a key (key
    position <= query position, on and above the diagonal), -inf below; of like's
    dtype and array type."""
    key = (t, like.dtype, type(like))
    if key not in _causal_bias_cache:
        _causal_bias_cache[key] = np.tril(np.full_like(like, -np.inf, shape=(t, t)), -1)
    return _causal_bias_cache[key]


@tt._autocast_op('lower')  # inside torch.autocast: in float16 (tinytorch.py section 6b)
def fused_causal_attention(qkv, n_head, dropout_p=0.0):
    """Multi-head causal self-attention as ONE op with a hand-derived backward.

    qkv: the (B, T, 3C) output of the q/k/v projection. The result is the (B, T, C)
    input of the output projection: the same numbers as splitting q, k and v,
    making heads with reshape + transpose and calling
    scaled_dot_product_attention(is_causal=True) (a test proves it), but q, k, v and
    the heads are strided views of qkv instead of copies, only the attention
    probabilities are kept for backward, and backward writes dq, dk and dv straight
    into one (B, T, 3C) gradient. Per head, with S = q k^T / sqrt(D) and P = softmax(S):
        out = P v,  dv = P^T g,  dP = g v^T,  dS = P * (dP - sum(P * dP)),
        dq = dS k / sqrt(D),  dk = dS^T q / sqrt(D).
    The arrays hold S^T and P^T (keys down, queries across): the softmax's max and sum
    over the keys are then reductions down the columns, which NumPy does about twice
    as fast as along rows as short as these.
    With dropout_p > 0, P is replaced by P * M (M the inverted-dropout mask of
    nn.dropout, drawn the same way) in out and dv, and dP is multiplied by M.
    """
    B, T, C3 = qkv.shape
    C, H = C3 // 3, n_head
    D = C // H
    scale = 1.0 / math.sqrt(D)
    # (B, T, 3C) -> (B, T, 3, H, D) -> (3, B, H, T, D): q, k, v per head, as views
    q, k, v = qkv.array.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)
    pt = np.empty_like(q, shape=(B, H, T, T))  # P^T, kept for backward
    y = np.empty_like(q, shape=(B, T, H, D))  # heads side by side: (B, T, C) once reshaped
    mask_t = None  # M^T, the dropout mask nn.dropout would draw for P, transposed like P^T
    if dropout_p > 0:
        mask = nn.dropout_mask(pt.shape, dropout_p, pt.dtype)
        mask_t = np.ascontiguousarray(mask.swapaxes(-1, -2))
    pdt = pt if mask_t is None else np.empty_like(pt)  # P^T, or (P * M)^T with dropout

    # Batch items are independent, so threads can take a range each (tt.parallel_for).
    # BLAS already spreads a matmul over all cores once it has more than about 2^18
    # multiply-adds (OpenBLAS's threshold); then one thread here is the better choice.
    threads = tt.get_num_threads() if T * T * D <= 2 ** 18 else 1

    # A thread takes its batch items a few at a time: the softmax makes five passes over
    # the scores, which then stay in the cache (tt.CACHE_BLOCK floats) from first to last.
    per_piece = max(1, tt.CACHE_BLOCK // (H * T * T))

    def forward_rows(lo, hi):  # batch items lo..hi-1
        s = slice(lo, hi)
        st = np.matmul(k[s], q[s].swapaxes(-1, -2), out=pt[s])  # scores, transposed: k q^T
        st *= scale
        st += _causal_bias_keys_first(T, st)  # masked scores become -inf: probability 0
        # softmax over the keys, in place: subtract each query's max, exponentiate, normalise
        st -= st.max(axis=-2, keepdims=True)
        np.exp(st, out=st)
        st /= tt.sum_second_last(st)
        if mask_t is not None:
            np.multiply(st, mask_t[s], out=pdt[s])
        np.matmul(pdt[s].swapaxes(-1, -2), v[s], out=y[s].transpose(0, 2, 1, 3))  # P v
    tt.parallel_for(forward_rows, B, pt.size, threads, piece=per_piece)

    def backward(g):
        """d attention/d qkv: dv = P^T g, dS = P * (g v^T - sum(P * g v^T)), dq = dS k / sqrt(D), dk = dS^T q / sqrt(D)"""
        g = g.reshape(B, T, H, D).transpose(0, 2, 1, 3)  # (B, H, T, D) view
        yh = y.transpose(0, 2, 1, 3)  # the output, per head: (B, H, T, D)
        grad = np.empty_like(g, shape=(B, T, 3, H, D))
        dq, dk, dv = grad.transpose(2, 0, 3, 1, 4)  # views into the packed gradient
        dst = np.empty_like(pt)  # dP^T, then dS^T

        def backward_rows(lo, hi):
            s = slice(lo, hi)
            np.matmul(pdt[s], g[s], out=dv[s])  # dv = P^T g
            ds = np.matmul(v[s], g[s].swapaxes(-1, -2), out=dst[s])  # dP^T = v g^T
            if mask_t is not None:
                ds *= mask_t[s]  # through the dropout: dP = (g v^T) * M
            # dS = P * (dP - sum_j P_ij dP_ij), and sum_j P_ij (g_i . v_j) = g_i . y_i:
            # a sum over D (the output) instead of over T (FlashAttention's trick).
            ds -= tt.sum_last(g[s] * yh[s]).swapaxes(-1, -2)  # one value per query (column)
            ds *= pt[s]
            ds *= scale
            np.matmul(ds.swapaxes(-1, -2), k[s], out=dq[s])  # dq = dS k / sqrt(D)
            np.matmul(ds, q[s], out=dk[s])  # dk = dS^T q / sqrt(D)
        tt.parallel_for(backward_rows, B, pt.size, threads, piece=per_piece)
        return (grad.reshape(B, T, C3),)
    return tt.from_op(y.reshape(B, T, C), 'causal_attention', (qkv,), backward, saved=(qkv,),
                      saves_output=True)  # backward reads y

