"""Python bindings of specula, over its shared library (libspecula.so) through ctypes.

    import specula
    with specula.Model("target.gguf", backend="cpu") as target, \\
         specula.Model("draft.gguf", backend=target.backend) as draft, \\
         target.session(draft=draft, temperature=0.8, seed=1) as session:
        for piece in session.generate("The json module can be used to", max_tokens=64):
            print(piece, end="", flush=True)
        print(session.stats.acceptance_rate)

Every handle frees its C object when closed: by `close()`, at the end of a `with` block, or when
it is collected. Closing a backend or a model closes what was made from it first (models,
sessions, transcription contexts), so the C library's ownership rules (a backend outlives its
models, a model its sessions) hold whatever order Python frees them in. Errors are
`SpeculaError`, carrying the C status and the library's message.
"""

import array
import codecs
import ctypes
import enum
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Iterable, Iterator, List, Optional, Sequence, Union

from . import _capi
from ._capi import lib as _lib

__all__ = ["AsrModel", "Backend", "Device", "Model", "Segment", "Session", "SessionStats",
           "SpeculaError", "Status", "Stream", "StreamEvent", "Transcriber",
           "TranscriptionTimings", "devices",
           "set_log_callback", "version"]


class Status(enum.IntEnum):
    OK = 0
    ERR_INVALID_ARGUMENT = 1
    ERR_IO = 2
    ERR_FORMAT = 3
    ERR_UNSUPPORTED = 4
    ERR_OUT_OF_MEMORY = 5
    ERR_DEVICE_LOST = 6
    ERR_NO_DEVICE = 7
    ERR_ABORTED = 8
    ERR_CONTEXT_FULL = 9
    ERR_VOCAB_MISMATCH = 10
    ERR_BUFFER_TOO_SMALL = 11
    ERR_INTERNAL = 12


class SpeculaError(Exception):
    """A call into libspecula failed: `status` says how (a `Status`), the message what."""

    def __init__(self, status: int, message: str):
        try:
            self.status = Status(status)
        except ValueError:
            self.status = status
        self.message = message
        name = _lib.specula_status_name(status).decode()
        super().__init__(f"{message} ({name})" if message else name)


def _check(status: int) -> None:
    if status != 0:
        raise SpeculaError(status, _lib.specula_last_error().decode("utf-8", "replace"))


def _invalid(message: str) -> SpeculaError:
    return SpeculaError(Status.ERR_INVALID_ARGUMENT, message)


def version() -> str:
    return _lib.specula_version().decode()


_log_callback = None  # the ctypes trampoline must live as long as the library may call it


def set_log_callback(callback) -> None:
    """callback(level: int, message: str) receives the library's log (0 debug .. 3 error);
    None restores the default (warnings and errors to stderr)."""
    global _log_callback
    if callback is None:
        _lib.specula_set_log_callback(_capi.log_fn(), None)
        _log_callback = None
        return
    trampoline = _capi.log_fn(lambda level, message, _: callback(level, message.decode("utf-8",
                                                                                         "replace")))
    _lib.specula_set_log_callback(trampoline, None)
    _log_callback = trampoline


@dataclass(frozen=True)
class Device:
    kind: str
    index: int
    name: str
    is_discrete_gpu: bool
    is_software: bool
    memory_bytes: int


def _device(info: _capi.DeviceInfo) -> Device:
    return Device(_lib.specula_backend_kind_name(info.kind).decode(), info.index,
                  info.name.decode("utf-8", "replace"), info.is_discrete_gpu, info.is_software,
                  info.memory_bytes)


def devices() -> List[Device]:
    """Every device of every backend compiled into the library (the cpu first)."""
    count = ctypes.c_size_t()
    _check(_lib.specula_device_count(ctypes.byref(count)))
    out = []
    for i in range(count.value):
        info = _capi.DeviceInfo()
        _check(_lib.specula_device_get(i, ctypes.byref(info)))
        out.append(_device(info))
    return out


class _Handle:
    """A C object freed once: closing it closes its dependents first."""

    _free = None

    def __init__(self, parents: Sequence["_Handle"] = ()):
        self._ptr = None
        self._dependents = weakref.WeakSet()
        self._parents = list(parents)  # kept alive while this is
        for parent in self._parents:
            parent._dependents.add(self)

    def _adopt(self, parent: "_Handle") -> None:
        if parent not in self._parents:
            self._parents.append(parent)
            parent._dependents.add(self)

    @property
    def _handle(self):
        if self._ptr is None:
            raise _invalid(f"the {type(self).__name__} is closed")
        return self._ptr

    @property
    def closed(self) -> bool:
        return self._ptr is None

    def close(self) -> None:
        for dependent in list(self._dependents):
            dependent.close()
        if self._ptr is not None:
            ptr, self._ptr = self._ptr, None
            type(self)._free(ptr)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Backend(_Handle):
    """A device to run models on: "cpu", "vulkan", "cuda" or "auto" (the best one present)."""

    _free = _lib.specula_backend_free

    def __init__(self, kind: str = "auto", *, device: int = -1, device_name: Optional[str] = None,
                 n_threads: int = 0, **options):
        """options: the fields of specula_backend_options (specula.h), a path as True (on) or
        False (off), e.g. Backend("cpu", int8_inputs=False); those not given are the backend's
        own choice."""
        super().__init__()
        params = _capi.BackendParams()
        _lib.specula_backend_default_params_by_ref(ctypes.byref(params))
        k = ctypes.c_int()
        _check(_lib.specula_backend_kind_from_name(kind.encode(), ctypes.byref(k)))
        params.kind, params.device_index, params.n_threads = k.value, device, n_threads
        params.device_name = device_name.encode() if device_name is not None else None
        known = {name for name, _ in _capi.BackendOptions._fields_}
        for name, value in options.items():
            if name not in known:
                raise TypeError(f"unknown backend option {name!r} (specula_backend_options: "
                                f"{', '.join(sorted(known))})")
            if name in _capi.BACKEND_PATHS:
                value = _capi.PATH_ON if value else _capi.PATH_OFF
            setattr(params.options, name, value)
        ptr = ctypes.c_void_p()
        _check(_lib.specula_backend_create(ctypes.byref(params), ctypes.byref(ptr)))
        self._ptr = ptr.value

    @property
    def device(self) -> Device:
        info = _capi.DeviceInfo()
        _check(_lib.specula_backend_get_info(self._handle, ctypes.byref(info)))
        return _device(info)

    @property
    def available_memory(self) -> int:
        n = ctypes.c_uint64()
        _check(_lib.specula_backend_available_memory(self._handle, ctypes.byref(n)))
        return n.value


class _Loaded(_Handle):
    """A model on a backend: a `Backend`, or a kind's name (None: "auto") for a backend of its
    own, which it closes with itself."""

    def __init__(self, backend: Union[Backend, str, None]):
        self._owned_backend = None if isinstance(backend, Backend) else Backend(backend or "auto")
        self.backend = self._owned_backend or backend
        super().__init__([self.backend])

    def _load(self, load) -> None:
        """Runs load(backend handle, out pointer); a failed load closes an owned backend."""
        ptr = ctypes.c_void_p()
        try:
            _check(load(self.backend._handle, ctypes.byref(ptr)))
        except BaseException:
            self.close()
            raise
        self._ptr = ptr.value

    def close(self) -> None:
        super().close()
        owned, self._owned_backend = getattr(self, "_owned_backend", None), None
        if owned is not None:
            owned.close()


def _model_params(read_into_memory: bool, progress):
    params = _capi.ModelParams()
    _lib.specula_model_default_params_by_ref(ctypes.byref(params))
    params.read_into_memory = read_into_memory
    trampoline = None
    if progress is not None:
        trampoline = _capi.progress_fn(lambda p, _: progress(p) is not False)
        params.progress = trampoline
    return params, trampoline


def _read_string(call, initial: int = 256) -> str:
    """Runs a C call that writes bytes and their length, growing the buffer as it asks."""
    capacity = initial
    while True:
        buf = ctypes.create_string_buffer(max(capacity, 1))
        length = ctypes.c_size_t()
        status = call(buf, capacity, ctypes.byref(length))
        if status == Status.ERR_BUFFER_TOO_SMALL and length.value > capacity:
            capacity = length.value
            continue
        _check(status)
        return buf.raw[:length.value].decode("utf-8", "replace")


@dataclass(frozen=True)
class ModelInfo:
    architecture: str
    name: str
    tokenizer: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    bos_token: int
    eos_token: int
    n_params: int
    weight_bytes: int
    weight_type: int


class Model(_Loaded):
    """A GGUF language model on a backend (a `Backend`, or a kind's name for a backend of its own,
    which the model closes with itself). A draft goes on its target's backend:
    `Model(path, backend=target.backend)`. `data` (instead of a path) loads a GGUF file's bytes."""

    _free = _lib.specula_model_free

    def __init__(self, path: Union[str, os.PathLike, None] = None,
                 backend: Union[Backend, str, None] = None, *, data: Optional[bytes] = None,
                 read_into_memory: bool = False, progress=None):
        if (path is None) == (data is None):
            raise _invalid("a model needs a path or data, not both")
        super().__init__(backend)
        params, _keep = _model_params(read_into_memory, progress)
        if data is not None:
            data = bytes(data)
            self._load(lambda b, out: _lib.specula_model_load_from_memory(
                b, data, len(data), ctypes.byref(params), out))
        else:
            self._load(lambda b, out: _lib.specula_model_load(b, os.fsencode(path),
                                                              ctypes.byref(params), out))

    @property
    def info(self) -> ModelInfo:
        i = _capi.ModelInfo()
        _check(_lib.specula_model_get_info(self._handle, ctypes.byref(i)))
        return ModelInfo(i.architecture.decode(), i.name.decode("utf-8", "replace"),
                         i.tokenizer.decode(), i.n_vocab, i.n_ctx_train, i.n_embd, i.n_layer,
                         i.n_head, i.n_head_kv, i.n_ff, i.bos_token, i.eos_token, i.n_params,
                         i.weight_bytes, i.weight_type)

    def tokenize(self, text: str, *, add_bos: bool = True, parse_special: bool = False) -> List[int]:
        data = text.encode("utf-8")
        flags = (_capi.TOKENIZE_ADD_BOS if add_bos else 0) | (
            _capi.TOKENIZE_PARSE_SPECIAL if parse_special else 0)
        capacity = len(data) + 2
        while True:
            tokens = (ctypes.c_int32 * capacity)()
            n = ctypes.c_size_t()
            status = _lib.specula_tokenize(self._handle, data, len(data), flags, tokens, capacity,
                                           ctypes.byref(n))
            if status == Status.ERR_BUFFER_TOO_SMALL and n.value > capacity:
                capacity = n.value
                continue
            _check(status)
            return list(tokens[:n.value])

    def detokenize(self, tokens: Sequence[int]) -> str:
        ids = (ctypes.c_int32 * len(tokens))(*tokens)
        return _read_string(lambda buf, cap, n: _lib.specula_detokenize(
            self._handle, ids, len(tokens), buf, cap, n), 8 * len(tokens) + 16)

    def token_text(self, token: int) -> str:
        """A token's text as the vocabulary writes it (a control token's own text too)."""
        return _read_string(lambda buf, cap, n: _lib.specula_token_text(self._handle, token, buf,
                                                                         cap, n), 64)

    def ends_generation(self, token: int) -> bool:
        return bool(_lib.specula_token_ends_generation(self._handle, token))

    def apply_chat_template(self, messages: Iterable[dict], *, add_generation_prompt: bool = True,
                            template: Optional[str] = None) -> str:
        """A conversation ([{"role": ..., "content": ...}, ...]) as the model's chat template
        writes it; tokenize it with `add_bos=False, parse_special=True`."""
        messages = list(messages)
        keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
        array_ = (_capi.ChatMessage * max(len(keep), 1))(*[_capi.ChatMessage(r, c) for r, c in keep])
        tmpl = template.encode() if template is not None else None
        return _read_string(lambda buf, cap, n: _lib.specula_chat_apply_template(
            self._handle, tmpl, array_, len(keep), add_generation_prompt, buf, cap, n), 4096)

    def session(self, **params) -> "Session":
        """A decoding session on this model; see `Session`."""
        return Session(self, **params)


@dataclass(frozen=True)
class SessionStats:
    n_past: int
    n_prompt_tokens: int
    n_generated: int
    n_forward_calls: int
    n_host_waits: int
    prompt_seconds: float
    generate_seconds: float
    n_steps: int
    n_drafted: int
    n_accepted: int
    n_evaluated: int
    acceptance_rate: float  # α: accepted / judged drafts
    tokens_per_step: float  # generated tokens per target forward
    draft_seconds: float
    target_seconds: float
    verify_seconds: float
    last_gamma: int
    n_lookup_drafted: int
    n_lookup_accepted: int
    n_shared_steps: int  # steps run in one forward with other sessions' (threads at once)


def _policy(name: str) -> int:
    p = ctypes.c_int()
    _check(_lib.specula_gamma_policy_from_name(name.encode(), ctypes.byref(p)))
    return p.value


class Session(_Handle):
    """A context on a model, with its sampling settings and, optionally, a draft model (on the
    same backend) or prompt lookup (`lookup_ngram`) for speculative decoding. The output is the
    target's whatever the draft: greedy (temperature 0) token for token, sampled the target
    alone's text for the seed (the coupled acceptance, the default)."""

    _free = _lib.specula_session_free

    def __init__(self, model: Model, *, draft: Optional[Model] = None, n_ctx: int = 0,
                 seed: int = 0, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 gamma_policy: str = "auto", gamma: Optional[int] = None,
                 gamma_max: Optional[int] = None, coupled_acceptance: bool = True,
                 lookup_ngram: int = 0):
        super().__init__([model] + ([draft] if draft is not None else []))
        self.model = model
        p = _capi.SessionParams()
        _lib.specula_session_default_params_by_ref(ctypes.byref(p))
        p.n_ctx, p.seed, p.temperature, p.top_k, p.top_p = n_ctx, seed, temperature, top_k, top_p
        p.draft = draft._handle if draft is not None else None
        p.gamma_policy = _policy(gamma_policy)
        if gamma is not None:
            p.gamma = gamma
        if gamma_max is not None:
            p.gamma_max = gamma_max
        p.coupled_acceptance, p.lookup_ngram = coupled_acceptance, lookup_ngram
        ptr = ctypes.c_void_p()
        _check(_lib.specula_session_create(model._handle, ctypes.byref(p), ctypes.byref(ptr)))
        self._ptr = ptr.value

    def reset(self) -> None:
        """Forgets the context; keeps what the γ policy measured."""
        _check(_lib.specula_session_reset(self._handle))

    def set_sampling(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                     seed: int = 0) -> None:
        """New sampling settings for what follows (a server's request): forgets the context,
        keeps the caches' memory and what the γ policy measured."""
        _check(_lib.specula_session_set_sampling(self._handle, temperature, top_k, top_p, seed))

    def eval(self, prompt: Union[str, Sequence[int]]) -> None:
        """Appends a prompt (text, tokenized with BOS when the context is empty, or token ids)."""
        if isinstance(prompt, str):
            prompt = self.model.tokenize(prompt, add_bos=self.stats.n_past == 0)
        ids = (ctypes.c_int32 * len(prompt))(*prompt)
        _check(_lib.specula_session_eval(self._handle, ids, len(prompt)))

    def logits(self) -> array.array:
        """The logits of the last evaluated position (n_vocab floats)."""
        n = self.model.info.n_vocab
        out = array.array("f", bytes(4 * n))
        ptr = (ctypes.c_float * n).from_buffer(out)
        _check(_lib.specula_session_get_logits(self._handle, ptr, n))
        return out

    def generate(self, prompt: Union[str, Sequence[int], None] = None, *, max_tokens: int = 256,
                 stop_at_eos: bool = True) -> Iterator[str]:
        """Evaluates `prompt` (if given) when iteration starts, then yields the generated text
        piece by piece (whole UTF-8 characters). Leaving the loop early stops generation after the
        last piece seen: a step's tokens beyond it stay in the context, and the next call yields
        them first, so the calls together yield one uninterrupted run. `tokens()` yields token
        ids instead."""
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for _, piece in self._stream(prompt, max_tokens, stop_at_eos):
            text = decoder.decode(piece)
            if text:
                yield text
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail

    def tokens(self, prompt: Union[str, Sequence[int], None] = None, *, max_tokens: int = 256,
               stop_at_eos: bool = True) -> Iterator[int]:
        for token, _ in self._stream(prompt, max_tokens, stop_at_eos):
            yield token

    def _stream(self, prompt, max_tokens: int, stop_at_eos: bool):
        # specula_generate runs in a worker thread (ctypes lets go of the GIL in the call) and
        # hands each token over as it is produced; the worker waits in its callback until the
        # consumer asks for the next one, so stopping the loop stops generation right after the
        # last token the consumer saw (specula_generate keeps the rest of that step for the
        # next call).
        if prompt is not None:
            self.eval(prompt)
        handle = self._handle
        cond = threading.Condition()
        # wanted: tokens the consumer asked for beyond those handed over
        state = {"items": [], "wanted": 0, "stop": False, "done": False, "error": None}

        def on_token(token, piece, length, _):
            with cond:
                state["items"].append((token, ctypes.string_at(piece, length)))
                cond.notify_all()
                cond.wait_for(lambda: state["wanted"] > 0 or state["stop"])
                if state["stop"]:
                    return False
                state["wanted"] -= 1
                return True

        callback = _capi.token_fn(on_token)
        abort = _capi.abort_fn(lambda _: state["stop"])
        params = _capi.GenerateParams()
        _lib.specula_generate_default_params_by_ref(ctypes.byref(params))
        params.max_tokens, params.stop_at_eos = max_tokens, stop_at_eos
        params.on_token, params.should_abort = callback, abort

        def run():
            status = _lib.specula_generate(handle, ctypes.byref(params), None, 0, None)
            error = None
            if status != 0 and not (status == Status.ERR_ABORTED and state["stop"]):
                error = SpeculaError(status, _lib.specula_last_error().decode("utf-8", "replace"))
            with cond:
                state["done"], state["error"] = True, error
                cond.notify_all()

        worker = threading.Thread(target=run, name="specula-generate", daemon=True)
        worker.start()
        try:
            while True:
                with cond:
                    cond.wait_for(lambda: state["items"] or state["done"])
                    if not state["items"]:
                        break
                    item = state["items"].pop(0)
                yield item
                with cond:
                    state["wanted"] += 1
                    cond.notify_all()
            if state["error"] is not None:
                raise state["error"]
        finally:
            with cond:
                state["stop"] = True
                cond.notify_all()
            worker.join()

    @property
    def stats(self) -> SessionStats:
        s = _capi.SessionStats()
        _check(_lib.specula_session_get_stats(self._handle, ctypes.byref(s)))
        return SessionStats(s.n_past, s.n_prompt_tokens, s.n_generated, s.n_forward_calls,
                            s.n_host_waits, s.prompt_seconds, s.generate_seconds, s.n_steps,
                            s.n_drafted, s.n_accepted, s.n_evaluated, s.acceptance_rate,
                            s.tokens_per_step, s.draft_seconds, s.target_seconds,
                            s.verify_seconds, s.last_gamma, s.n_lookup_drafted,
                            s.n_lookup_accepted, s.n_shared_steps)

    @property
    def memory(self) -> tuple:
        """Backend bytes the session holds: (the target's, the draft's)."""
        t, d = ctypes.c_uint64(), ctypes.c_uint64()
        _check(_lib.specula_session_memory(self._handle, ctypes.byref(t), ctypes.byref(d)))
        return t.value, d.value


# ------------------------------------------------------------------------------------- speech


@dataclass(frozen=True)
class Segment:
    start: float  # seconds from the start of the audio
    end: float
    text: str


@dataclass(frozen=True)
class TranscriptionTimings:
    audio_seconds: float
    mel_seconds: float
    encode_seconds: float
    decode_seconds: float
    windows: int
    fallbacks: int
    tokens: int
    language: str
    n_steps: int
    n_emitted: int
    n_drafted: int
    n_evaluated: int
    n_accepted: int


@dataclass(frozen=True)
class StreamEvent:
    final: bool   # a final segment (never changes), or the utterance's partial text
    start: float  # seconds from the start of the stream
    end: float
    text: str
    stable: str   # the beginning of text that later partials and the finals keep


class AsrModel(_Loaded):
    """A Whisper model in whisper.cpp's format (ggml-*.bin) on a backend (as for `Model`). With
    `tokens`, a draft that proposes only those ids (and the special and timestamp tokens)."""

    _free = _lib.specula_asr_model_free

    def __init__(self, path: Union[str, os.PathLike], backend: Union[Backend, str, None] = None, *,
                 tokens: Optional[Sequence[int]] = None, read_into_memory: bool = False,
                 progress=None):
        super().__init__(backend)
        params, _keep = _model_params(read_into_memory, progress)
        if tokens is None:
            self._load(lambda b, out: _lib.specula_asr_model_load(b, os.fsencode(path),
                                                                  ctypes.byref(params), out))
        else:
            ids = (ctypes.c_int32 * max(len(tokens), 1))(*tokens)
            self._load(lambda b, out: _lib.specula_asr_draft_load(
                b, os.fsencode(path), ctypes.byref(params), ids, len(tokens), out))

    @property
    def info(self) -> dict:
        i = _capi.AsrModelInfo()
        _check(_lib.specula_asr_model_get_info(self._handle, ctypes.byref(i)))
        return {name: getattr(i, name) for name, _ in _capi.AsrModelInfo._fields_}

    def transcriber(self) -> "Transcriber":
        return Transcriber(self)


def _samples(audio):
    """16 kHz mono samples in [-1, 1] as a C float array (NumPy arrays without a copy when they
    are contiguous float32)."""
    try:
        import numpy as np
        if isinstance(audio, np.ndarray):
            a = np.ascontiguousarray(audio, dtype=np.float32)
            if a.ndim != 1:
                raise _invalid("audio must be one channel: a 1-D array of samples")
            return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), a.size, a
    except ImportError:
        pass
    a = array.array("f", audio)
    if not a:
        return None, 0, a
    return (ctypes.c_float * len(a)).from_buffer(a), len(a), a


class Transcriber(_Handle):
    """A transcription context of an `AsrModel` (its encoder output and decoder caches)."""

    _free = _lib.specula_asr_context_free

    def __init__(self, model: AsrModel):
        super().__init__([model])
        ptr = ctypes.c_void_p()
        _check(_lib.specula_asr_context_create(model._handle, ctypes.byref(ptr)))
        self._ptr = ptr.value

    def transcribe(self, audio, *, language: Optional[str] = None, translate: bool = False,
                   timestamps: bool = True, temperature: Optional[float] = None,
                   temperature_increment: Optional[float] = None, seed: Optional[int] = None,
                   condition_on_previous_text: Optional[bool] = None,
                   draft: Optional[AsrModel] = None, gamma_policy: Optional[str] = None,
                   gamma: Optional[int] = None, gamma_max: Optional[int] = None,
                   on_segment=None, progress=None) -> List[Segment]:
        """Transcribes an audio file (a path, or its bytes: WAV, FLAC, MP3, Ogg) or 16 kHz mono
        samples (a NumPy array or any sequence of floats). With `draft` (an `AsrModel` on the
        same backend) decoding is speculative and the transcript stays the target's.
        on_segment(Segment) sees each segment as it is decoded; progress(fraction) returning
        False aborts."""
        p = _capi.AsrParams()
        _lib.specula_asr_default_params_by_ref(ctypes.byref(p))
        self._set_params(p, language, translate, timestamps, temperature, temperature_increment,
                         seed, condition_on_previous_text, draft, gamma_policy, gamma, gamma_max)
        keep = []
        if on_segment is not None:
            def segment(s, _):
                on_segment(Segment(s.contents.t0_ms / 1000, s.contents.t1_ms / 1000,
                                   s.contents.text.decode("utf-8", "replace")))
            keep.append(_capi.segment_fn(segment))
            p.on_segment = keep[-1]
        if progress is not None:
            keep.append(_capi.progress_fn(lambda f, _: progress(f) is not False))
            p.progress = keep[-1]
        if isinstance(audio, (str, os.PathLike)):
            _check(_lib.specula_asr_transcribe_file(self._handle, os.fsencode(audio),
                                                    ctypes.byref(p)))
        elif isinstance(audio, (bytes, bytearray)):
            data = ctypes.create_string_buffer(bytes(audio), len(audio))
            _check(_lib.specula_asr_transcribe_memory(self._handle, data, len(audio),
                                                      ctypes.byref(p)))
        else:
            ptr, n, _owner = _samples(audio)
            _check(_lib.specula_asr_transcribe(self._handle, ptr, n, ctypes.byref(p)))
        return self.segments

    def _set_params(self, p, language, translate, timestamps, temperature, temperature_increment,
                    seed, condition_on_previous_text, draft, gamma_policy, gamma, gamma_max):
        self._language = language.encode() if language is not None else None  # kept alive
        p.language, p.translate, p.timestamps = self._language, translate, timestamps
        for name, value in (("temperature", temperature),
                            ("temperature_increment", temperature_increment), ("seed", seed),
                            ("condition_on_previous_text", condition_on_previous_text),
                            ("gamma", gamma), ("gamma_max", gamma_max)):
            if value is not None:
                setattr(p, name, value)
        if gamma_policy is not None:
            p.gamma_policy = _policy(gamma_policy)
        if draft is not None:
            p.draft = draft._handle
            self._adopt(draft)  # the context keeps the draft's caches

    def stream(self, on_event, *, step_ms: Optional[int] = None,
               end_silence_ms: Optional[int] = None, vad_aggressiveness: Optional[int] = None,
               pre_roll_ms: Optional[int] = None, max_utterance_ms: Optional[int] = None,
               language: Optional[str] = None, translate: bool = False, timestamps: bool = True,
               temperature: Optional[float] = None, temperature_increment: Optional[float] = None,
               seed: Optional[int] = None, draft: Optional[AsrModel] = None,
               gamma_policy: Optional[str] = None, gamma: Optional[int] = None,
               gamma_max: Optional[int] = None) -> "Stream":
        """Live transcription: a `Stream` that takes audio as it arrives and calls
        on_event(StreamEvent) with each utterance's partial text and its final segments. While
        it is open this transcriber transcribes nothing else."""
        p = _capi.AsrStreamParams()
        _lib.specula_asr_stream_default_params_by_ref(ctypes.byref(p))
        self._set_params(p.asr, language, translate, timestamps, temperature,
                         temperature_increment, seed, None, draft, gamma_policy, gamma, gamma_max)
        for name, value in (("step_ms", step_ms), ("end_silence_ms", end_silence_ms),
                            ("vad_aggressiveness", vad_aggressiveness),
                            ("pre_roll_ms", pre_roll_ms), ("max_utterance_ms", max_utterance_ms)):
            if value is not None:
                setattr(p, name, value)
        return Stream(self, p, on_event)

    @property
    def segments(self) -> List[Segment]:
        out = []
        for i in range(_lib.specula_asr_segment_count(self._handle)):
            s = _capi.AsrSegment()
            _check(_lib.specula_asr_get_segment(self._handle, i, ctypes.byref(s)))
            out.append(Segment(s.t0_ms / 1000, s.t1_ms / 1000, s.text.decode("utf-8", "replace")))
        return out

    @property
    def timings(self) -> TranscriptionTimings:
        t = _capi.AsrTimings()
        _check(_lib.specula_asr_get_timings(self._handle, ctypes.byref(t)))
        return _timings(t)


def _timings(t) -> TranscriptionTimings:
    return TranscriptionTimings(t.audio_seconds, t.mel_seconds, t.encode_seconds,
                                t.decode_seconds, t.windows, t.fallbacks, t.tokens,
                                t.language.decode(), t.n_steps, t.n_emitted, t.n_drafted,
                                t.n_evaluated, t.n_accepted)


class Stream(_Handle):
    """A live transcription (`Transcriber.stream`): push audio as it arrives, finish at its end.
    Events come during push() and finish(), in the calling thread."""

    _free = _lib.specula_asr_stream_free

    def __init__(self, transcriber: Transcriber, params, on_event):
        super().__init__([transcriber])

        def event(e, _):
            text = e.contents.text
            on_event(StreamEvent(bool(e.contents.is_final), e.contents.t0_ms / 1000,
                                 e.contents.t1_ms / 1000, text.decode("utf-8", "replace"),
                                 text[:e.contents.stable_bytes].decode("utf-8", "replace")))
        self._callback = _capi.stream_event_fn(event)  # kept alive while the stream is
        params.on_event = self._callback
        self._params = params
        ptr = ctypes.c_void_p()
        _check(_lib.specula_asr_stream_create(transcriber._handle, ctypes.byref(params),
                                              ctypes.byref(ptr)))
        self._ptr = ptr.value

    def push(self, samples, sample_rate: int = 16000) -> None:
        """Mono samples in [-1, 1] (a NumPy array or any sequence of floats) at sample_rate, or
        16-bit little-endian PCM bytes."""
        if isinstance(samples, (bytes, bytearray, memoryview)):
            data = bytes(samples)
            _check(_lib.specula_asr_stream_push_pcm16(self._handle, data, len(data),
                                                      sample_rate))
            return
        ptr, n, _owner = _samples(samples)
        _check(_lib.specula_asr_stream_push(self._handle, ptr, n, sample_rate))

    def finish(self) -> None:
        """The end of the audio: the utterance under way becomes final."""
        _check(_lib.specula_asr_stream_finish(self._handle))

    @property
    def timings(self) -> TranscriptionTimings:
        t = _capi.AsrTimings()
        _check(_lib.specula_asr_stream_get_timings(self._handle, ctypes.byref(t)))
        return _timings(t)
