"""export.py: take a GPT trained here to the PyTorch ecosystem, and bring one back.

    python export.py out/best.npz --to hf hf_model      # Hugging Face GPT-2 (no torch needed)
    python export.py out/best.npz --to nanogpt ng_out   # nanoGPT's ckpt.pt + meta.pkl (torch)
    python export.py --from-hf hf_model --out-dir out_hf
    python export.py --from-nanogpt ng_out/ckpt.pt --out-dir out_ng

tinytorch's GPT is nanoGPT's architecture, and GPT-2's: the same blocks, the same
names (nanoGPT adds a `transformer.` prefix), the same exact GELU and LayerNorm. So the
numbers move unchanged; only the layouts differ. GPT-2's attention and MLP weights are
`Conv1D`s, stored (in, out), the transpose of a Linear's (out, in); nanoGPT's are
Linears, as here. A checkpoint brought back (`--from-...`) is a train_charlm.py
checkpoint (OUT_DIR/ckpt.npz and best.npz): `python train_charlm.py --sample --out-dir
OUT_DIR` samples from it, and `--resume` continues training it.

Reading and writing Hugging Face's files needs only NumPy (files.py reads and writes
safetensors). nanoGPT's ckpt.pt is a PyTorch file: files.read_nanogpt reads it (and
meta.pkl) with tt.load's grammar, without PyTorch (no code in a file ever runs); writing
one (--to nanogpt) imports torch.
"""
import argparse
import json
import os
import pickle
import sys

import numpy as np

import files
import nn
import tinytorch as tt
import train_charlm
from train_charlm import BEST_NAME, CKPT_NAME, UserError  # its checkpoints, its errors
from transformer import GPTConfig

CONV1D = ('attn.c_attn.weight', 'attn.c_proj.weight', 'mlp.c_fc.weight', 'mlp.c_proj.weight')


# ---------------------------------------------------------------------------
# tinytorch checkpoints (train_charlm.py's)
# ---------------------------------------------------------------------------
def read_checkpoint(path):
    """A train_charlm.py checkpoint; a folder means its best.npz (or ckpt.npz)."""
    if os.path.isdir(path):
        path = next((os.path.join(path, n) for n in (BEST_NAME, CKPT_NAME)
                     if os.path.exists(os.path.join(path, n))), os.path.join(path, BEST_NAME))
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path}")
    ck = train_charlm.read_checkpoint(path, keys=('model', 'config', 'vocab'))
    kind = ck['config'].get('kind', 'gpt')  # train_charlm.py --model lstm or gru
    if kind != 'gpt':
        raise UserError(f"{path} holds a recurrent model (train_charlm.py --model {kind}); "
                        "export.py exports GPT checkpoints only (GPT-2 and nanoGPT are "
                        "Transformers)")
    return ck


def make_out_dir(out_dir):
    """The folder the files go into: made if needed; a path that is a file, or that
    cannot be made, is one UserError line."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot write to the output folder {out_dir}: {e.strerror or e}") from None


def write_checkpoint(ck, out_dir, force):
    """ckpt.npz and best.npz in out_dir, as train_charlm.py writes them (never over a run)."""
    paths = [os.path.join(out_dir, n) for n in (CKPT_NAME, BEST_NAME)]
    held = [p for p in paths if os.path.exists(p)]
    if held and not force:
        raise UserError(f"{held[0]} already exists; give another --out-dir, or --force to "
                        "replace it")
    make_out_dir(out_dir)
    for p in paths:
        nn.save(ck, p)
    print(f"wrote {paths[0]} and {paths[1]}: python train_charlm.py --sample --out-dir {out_dir}")


def _imported(config, state, vocab, source, step=0, best_val_loss=None, optimizer=None):
    """A train_charlm.py checkpoint around weights that came from elsewhere."""
    ck = {'model': {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in state.items()},
          'config': config, 'vocab': vocab, 'step': int(step), 'source': source,
          'best': {'step': int(step), 'val_loss': float(best_val_loss)} if best_val_loss is not None
          else {}}
    if optimizer is not None:
        ck['optimizer'] = optimizer
    return ck


def _is_mask(name):
    """h.0.attn.bias (not h.0.attn.c_attn.bias): a causal-mask buffer, not a weight."""
    return name.split('.')[-2:] in (['attn', 'bias'], ['attn', 'masked_bias'])


# ---------------------------------------------------------------------------
# Settings and vocabularies read from another program's files
# ---------------------------------------------------------------------------
# each file's name for a GPT setting: train_charlm.py's name, whose rule checks it
HF_SETTINGS = {'vocab_size': 'vocab_size', 'n_positions': 'block_size', 'n_layer': 'n_layer',
               'n_head': 'n_head', 'n_embd': 'n_embd'}
NANOGPT_SETTINGS = {'vocab_size': 'vocab_size', 'block_size': 'block_size', 'n_layer': 'n_layer',
                    'n_head': 'n_head', 'n_embd': 'n_embd'}
DROPOUT = {'resid_pdrop': 'dropout', 'dropout': 'dropout'}  # optional: 0.0 when absent
THEIRS = "the file is damaged, or not a model tinytorch's GPT can read"


def check_gpt_settings(settings, names, path):
    """A model's settings from another program's file (config.json, nanoGPT's model_args),
    each checked as train_charlm.py checks its flag (train_charlm.setting_problem, in the
    same words) before any work; names maps the file's name to train_charlm.py's."""
    if not isinstance(settings, dict):
        raise UserError(f"{path} holds {train_charlm.show(settings)}, not a dict of settings; "
                        f"{THEIRS}")
    missing = [k for k in names if k not in settings]
    if missing:
        raise UserError(f"{path} has no {', '.join(missing)}; {THEIRS}")
    for theirs, ours in {**names, **DROPOUT}.items():
        problem = (train_charlm.setting_problem(ours, settings[theirs])
                   if theirs in settings else None)
        if problem:
            raise UserError(f"{path}: {theirs} {train_charlm.show(settings[theirs])} {problem}; "
                            f"{THEIRS}")
    n_embd, n_head = settings['n_embd'], settings['n_head']
    if n_embd % n_head:
        raise UserError(f"{path}: n_embd {n_embd} is not a multiple of n_head {n_head} (each "
                        f"head gets n_embd / n_head channels); {THEIRS}")


def vocab_from(itos, path, size, key):
    """The vocabulary string from id -> character (vocab.json's keys '0', '1', ...: key=str;
    meta.pkl's 0, 1, ...: key=int): size one-character strings, distinct and in sorted
    order, as train_charlm.py numbers characters (its ids are their ranks), else one
    UserError line."""
    if not isinstance(itos, dict):
        raise UserError(f"{path} holds {train_charlm.show(itos)}, not a dict of id -> "
                        f"character; {THEIRS}")
    if len(itos) != size:
        raise UserError(f"{path} has {len(itos)} characters, the model's vocab_size is {size}; "
                        f"{THEIRS}")
    chars = [itos.get(key(i)) for i in range(size)]
    for i, c in enumerate(chars):
        if not isinstance(c, str) or len(c) != 1:
            raise UserError(f"{path}: id {i} is {train_charlm.show(c)}, not one character; "
                            f"{THEIRS}")
    vocab = ''.join(chars)
    if vocab != ''.join(sorted(set(vocab))):
        raise UserError(f"{path}: its characters are not distinct and in sorted order, as "
                        f"train_charlm.py numbers them; {THEIRS}")
    return vocab


def checked(ck, source):
    """An imported checkpoint, checked as train_charlm.py checks the checkpoints it reads
    (the config against the shapes of the weights), before it is written."""
    train_charlm.check_checkpoint(ck, source, tail=THEIRS)
    return ck


# ---------------------------------------------------------------------------
# Hugging Face GPT-2
# ---------------------------------------------------------------------------
def gpt2_config(config):
    """A GPT2Config (as a dict) for a tinytorch GPTConfig, or a UserError if GPT-2 can't
    express the model."""
    if not config.get('bias', True):
        raise UserError("GPT-2 has biases in every Linear and LayerNorm; this model was "
                        "trained with bias=False, which GPT-2 cannot express")
    if not config.get('tie_weights', True):
        raise UserError("GPT-2 ties its output head to the token embedding; this model has "
                        "an untied head, which GPT-2 cannot express")
    return {'model_type': 'gpt2', 'architectures': ['GPT2LMHeadModel'],
            'vocab_size': config['vocab_size'], 'n_positions': config['block_size'],
            'n_ctx': config['block_size'], 'n_embd': config['n_embd'],
            'n_layer': config['n_layer'], 'n_head': config['n_head'], 'n_inner': None,
            'activation_function': 'gelu',  # exact GELU, as tinytorch's nn.GELU()
            'layer_norm_epsilon': 1e-5, 'resid_pdrop': config.get('dropout', 0.0),
            'embd_pdrop': config.get('dropout', 0.0), 'attn_pdrop': config.get('dropout', 0.0),
            'scale_attn_weights': True, 'tie_word_embeddings': True, 'use_cache': True,
            'bos_token_id': None, 'eos_token_id': None}


def to_hf(ck, out_dir, force):
    hf_config = gpt2_config(ck['config'])
    files = [os.path.join(out_dir, n) for n in ('config.json', 'model.safetensors', 'vocab.json')]
    if any(os.path.exists(f) for f in files) and not force:
        raise UserError(f"{out_dir} already holds an exported model; give another folder, or "
                        "--force to replace it")
    tensors = {}
    for name, a in ck['model'].items():
        if name == 'lm_head.weight':
            continue  # tied to the token embedding: GPT-2 stores it once
        tensors['transformer.' + name] = a.T if name.endswith(CONV1D) else a  # Conv1D: (in, out)
    make_out_dir(out_dir)
    with open(files[0], 'w') as f:
        json.dump(hf_config, f, indent=2)
    nn.save_safetensors({k: np.ascontiguousarray(v) for k, v in tensors.items()}, files[1],
                        metadata={'format': 'pt'})
    with open(files[2], 'w', encoding='utf-8') as f:
        json.dump({str(i): c for i, c in enumerate(ck['vocab'])}, f, ensure_ascii=False, indent=0)
    print(f"wrote {', '.join(files)}")


def from_hf(folder):
    paths = {n: os.path.join(folder, n) for n in ('config.json', 'model.safetensors', 'vocab.json')}
    for path in paths.values():
        if not os.path.exists(path):
            raise UserError(f"{path} not found: --from-hf needs a folder with config.json, "
                            "model.safetensors and vocab.json (as --to hf writes them)")
    try:
        with files.open_regular(paths['config.json']) as f:  # a FIFO there: refused, not waited on
            hf = json.loads(f.read().decode('utf-8'))
        with files.open_regular(paths['vocab.json']) as f:
            ids = json.loads(f.read().decode('utf-8'))
    except (OSError, ValueError, RecursionError) as e:  # unreadable, not JSON or UTF-8, too deep
        raise UserError(f"{folder}: cannot read it ({type(e).__name__}: {e})") from None
    check_gpt_settings(hf, HF_SETTINGS, paths['config.json'])
    vocab = vocab_from(ids, paths['vocab.json'], hf['vocab_size'], key=str)
    try:
        tensors, _ = nn.load_safetensors(paths['model.safetensors'])
    except nn.CheckpointError as e:
        raise UserError(f"{folder}: cannot read it ({type(e).__name__}: {e})") from None
    if hf.get('model_type') != 'gpt2':
        raise UserError(f"{folder}: tinytorch reads GPT-2 models (model_type 'gpt2'); this one "
                        f"has model_type {hf.get('model_type')!r}")
    if hf.get('activation_function', 'gelu_new') != 'gelu':  # gelu_new: GPT-2's default
        has = (f"activation_function {hf['activation_function']!r}" if 'activation_function' in hf
               else "no activation_function, so GPT-2's default 'gelu_new' (the tanh "
                    "approximation)")
        raise UserError(f"{folder}: tinytorch reads GPT-2 models with the exact GELU "
                        f"(activation_function 'gelu'); this one has {has}")
    config = GPTConfig(vocab_size=hf['vocab_size'], block_size=hf['n_positions'],
                       n_layer=hf['n_layer'], n_head=hf['n_head'], n_embd=hf['n_embd'],
                       dropout=hf.get('resid_pdrop', 0.0)).to_dict()
    state = {}
    for name, a in tensors.items():
        if _is_mask(name):
            continue  # older GPT-2 files store the causal mask as a buffer
        name = name.removeprefix('transformer.')
        state[name] = a.T if name.endswith(CONV1D) else a
    if 'wte.weight' in state:  # the head tied to the embedding: GPT-2 stores it once
        state.setdefault('lm_head.weight', state['wte.weight'])
    return checked(_imported(config, state, vocab, f"Hugging Face GPT-2 model in {folder}"),
                   folder)


# ---------------------------------------------------------------------------
# nanoGPT
# ---------------------------------------------------------------------------
def need_torch(what):
    try:
        import torch
    except ImportError:
        raise UserError(f"{what} needs PyTorch (pip install torch): nanoGPT's ckpt.pt is a "
                        "PyTorch file") from None
    return torch


def to_nanogpt(ck, out_dir, force):
    torch = need_torch("--to nanogpt")
    files = [os.path.join(out_dir, n) for n in ('ckpt.pt', 'meta.pkl')]
    if any(os.path.exists(f) for f in files) and not force:
        raise UserError(f"{out_dir} already holds an exported model; give another folder, or "
                        "--force to replace it")
    c = ck['config']
    model_args = {k: c[k] for k in ('n_layer', 'n_head', 'n_embd', 'block_size', 'bias',
                                    'vocab_size', 'dropout')}
    if not c.get('tie_weights', True):
        raise UserError("nanoGPT ties its output head to the token embedding; this model has "
                        "an untied head, which nanoGPT cannot express")
    state = {('transformer.' + k if k != 'lm_head.weight' else k): torch.from_numpy(np.array(v))
             for k, v in ck['model'].items()}
    best = ck.get('best', {}).get('val_loss', float('inf'))
    out = {'model': state, 'model_args': model_args, 'iter_num': int(ck.get('step', 0)),
           'best_val_loss': float(best),
           'config': {'dataset': 'tinytorch', **model_args, 'init_from': 'resume'}}
    if 'optimizer' in ck:  # the AdamW moments: the same layout as PyTorch's, step as a tensor
        opt = ck['optimizer']
        out['optimizer'] = {
            'state': {int(i): {'step': torch.tensor(float(s['step'])),
                               'exp_avg': torch.from_numpy(np.array(s['exp_avg'])),
                               'exp_avg_sq': torch.from_numpy(np.array(s['exp_avg_sq']))}
                      for i, s in opt['state'].items()},
            'param_groups': [{'lr': g['lr'], 'betas': tuple(g['betas']), 'eps': g['eps'],
                              'weight_decay': g['weight_decay'], 'amsgrad': False,
                              'params': list(g['params'])} for g in opt['param_groups']]}
    make_out_dir(out_dir)
    torch.save(out, files[0])
    vocab = ck['vocab']
    meta = {'vocab_size': len(vocab), 'itos': dict(enumerate(vocab)),
            'stoi': {ch: i for i, ch in enumerate(vocab)}}
    with open(files[1], 'wb') as f:
        pickle.dump(meta, f)  # nanoGPT's own format for the vocabulary
    print(f"wrote {files[0]} and {files[1]}"
          + ("" if 'optimizer' in ck else " (no optimizer state in this checkpoint: nanoGPT's "
             "--init_from=resume needs one; export a train_charlm.py ckpt.npz instead)"))


def from_nanogpt(path, meta_path=None):
    if not os.path.exists(path):
        raise UserError(f"nanoGPT checkpoint not found: {path}")
    meta_path = meta_path or os.path.join(os.path.dirname(path), 'meta.pkl')
    if not os.path.exists(meta_path):
        raise UserError(f"{meta_path} not found: the vocabulary (nanoGPT's meta.pkl) is needed "
                        "to read and write text; give it with --meta")
    try:
        pt, meta = files.read_nanogpt(path, meta_path)
        args, model = pt['model_args'], pt['model']
    except (files.CheckpointError, KeyError, TypeError, RuntimeError, EOFError, OSError) as e:
        raise UserError(f"cannot read {path} with {meta_path} ({type(e).__name__}: "
                        f"{str(e)[:120]})") from None
    check_gpt_settings(args, NANOGPT_SETTINGS, f"{path}'s model_args")
    if not isinstance(meta, dict) or not isinstance(model, dict) or \
            not all(isinstance(k, str) and isinstance(v, tt.Tensor) for k, v in model.items()):
        raise UserError(f"{path} with {meta_path}: not a nanoGPT checkpoint (a dict of tensors "
                        f"as model, a dict as meta.pkl); {THEIRS}")
    vocab = vocab_from(meta.get('itos'), meta_path, args['vocab_size'], key=int)
    config = GPTConfig(vocab_size=args['vocab_size'], block_size=args['block_size'],
                       n_layer=args['n_layer'], n_head=args['n_head'], n_embd=args['n_embd'],
                       dropout=args.get('dropout', 0.0), bias=args.get('bias', True)).to_dict()
    state = {k.removeprefix('_orig_mod.').removeprefix('transformer.'): v.float().numpy()
             for k, v in model.items() if not _is_mask(k)}
    optimizer = None
    try:  # the optimizer's state and the step count, as nanoGPT writes them
        if 'optimizer' in pt:
            o = pt['optimizer']
            optimizer = {'state': {int(i): {'step': int(s['step']),
                                            'exp_avg': s['exp_avg'].float().numpy(),
                                            'exp_avg_sq': s['exp_avg_sq'].float().numpy()}
                                   for i, s in o['state'].items()},
                         'param_groups': [{'weight_decay': g['weight_decay'], 'lr': g['lr'],
                                           'betas': tuple(g['betas']), 'eps': g['eps'],
                                           'params': list(g['params'])}
                                          for g in o['param_groups']]}
        ck = _imported(config, state, vocab, f"nanoGPT checkpoint {path}", pt.get('iter_num', 0),
                       pt.get('best_val_loss'), optimizer)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise UserError(f"{path}: its optimizer state or iter_num is not nanoGPT's "
                        f"({type(e).__name__}: {str(e)[:120]}); {THEIRS}") from None
    return checked(ck, path)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Export a train_charlm.py GPT to Hugging Face "
                                "GPT-2 or nanoGPT, or bring one back.")
    p.add_argument('checkpoint', nargs='?', help="a train_charlm.py checkpoint (a folder means "
                   "its best.npz)")
    p.add_argument('--to', nargs=2, metavar=('FORMAT', 'DIR'),
                   help="FORMAT hf (config.json, model.safetensors, vocab.json) or nanogpt "
                        "(ckpt.pt, meta.pkl), written into DIR")
    p.add_argument('--from-hf', metavar='DIR', help="read a GPT-2 model folder (as --to hf "
                   "writes it) into a train_charlm.py checkpoint")
    p.add_argument('--from-nanogpt', metavar='CKPT', help="read nanoGPT's ckpt.pt (and the "
                   "meta.pkl beside it) into a train_charlm.py checkpoint")
    p.add_argument('--meta', help="with --from-nanogpt: the meta.pkl to use")
    p.add_argument('--out-dir', help="with --from-...: the folder for ckpt.npz and best.npz")
    p.add_argument('--force', action='store_true', help="replace files that already exist")
    args = p.parse_args(argv)
    modes = sum(x is not None for x in (args.to, args.from_hf, args.from_nanogpt))
    if modes != 1:
        raise UserError("give exactly one of: CHECKPOINT --to FORMAT DIR, --from-hf DIR, "
                        "--from-nanogpt CKPT")
    if args.to is not None:
        if args.checkpoint is None:
            raise UserError("--to needs the checkpoint to export: export.py CHECKPOINT --to "
                            "FORMAT DIR")
        if args.to[0] not in ('hf', 'nanogpt'):
            raise UserError(f"--to: format must be hf or nanogpt, got {args.to[0]!r}")
    elif args.out_dir is None:
        raise UserError("--from-hf and --from-nanogpt need --out-dir (where ckpt.npz goes)")
    return args


def main(argv=None):
    try:
        args = parse_args(argv)
        if args.to is not None:
            ck = read_checkpoint(args.checkpoint)
            (to_hf if args.to[0] == 'hf' else to_nanogpt)(ck, args.to[1], args.force)
        else:
            ck = from_hf(args.from_hf) if args.from_hf else from_nanogpt(args.from_nanogpt,
                                                                           args.meta)
            write_checkpoint(ck, args.out_dir, args.force)
        return 0
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == '__main__':
    sys.exit(main())
