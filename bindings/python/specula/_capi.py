"""ctypes declarations of lib/include/specula.h: the structs field for field, the functions with
their argument types. tests/test_specula.py holds every struct's size and offsets to the C
compiler's (tests/python/layout_probe.c)."""

import ctypes
import ctypes.util
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char, c_char_p, c_double, c_float,
                    c_int, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p)

MAX_GAMMA = 16  # SPECULA_MAX_GAMMA
MAX_LOOKUP_NGRAM = 8  # SPECULA_MAX_LOOKUP_NGRAM
TOKENIZE_ADD_BOS = 1
TOKENIZE_PARSE_SPECIAL = 2

status_t = c_int
progress_fn = CFUNCTYPE(c_bool, c_float, c_void_p)
log_fn = CFUNCTYPE(None, c_int, c_char_p, c_void_p)
token_fn = CFUNCTYPE(c_bool, c_int32, c_void_p, c_size_t, c_void_p)
abort_fn = CFUNCTYPE(c_bool, c_void_p)


class DeviceInfo(Structure):
    _fields_ = [("kind", c_int), ("index", c_int32), ("name", c_char * 256),
                ("is_discrete_gpu", c_bool), ("is_software", c_bool), ("memory_bytes", c_uint64)]


PATH_AUTO, PATH_ON, PATH_OFF = 0, 1, 2  # specula_path
BACKEND_PATHS = ("int8_inputs", "tiled", "fused_norm", "fused_rope", "fused_gate", "subgroups",
                 "pin_subgroup", "small_storage", "staged", "tensor_cores", "split_attention",
                 "host_rules", "amx")


class BackendOptions(Structure):
    _fields_ = [(name, c_int) for name in BACKEND_PATHS] + [
                ("barrier_every_dispatch", c_bool), ("profile", c_bool),
                ("max_binding_bytes", c_uint64)]


class BackendParams(Structure):
    _fields_ = [("kind", c_int), ("device_index", c_int32), ("device_name", c_char_p),
                ("n_threads", c_int32), ("options", BackendOptions)]


class ModelParams(Structure):
    _fields_ = [("progress", progress_fn), ("progress_user_data", c_void_p),
                ("read_into_memory", c_bool)]


class ModelInfo(Structure):
    _fields_ = [("architecture", c_char * 32), ("name", c_char * 128), ("tokenizer", c_char * 16),
                ("n_vocab", c_int32), ("n_ctx_train", c_int32), ("n_embd", c_int32),
                ("n_layer", c_int32), ("n_head", c_int32), ("n_head_kv", c_int32),
                ("n_ff", c_int32), ("bos_token", c_int32), ("eos_token", c_int32),
                ("n_params", c_uint64), ("weight_bytes", c_uint64), ("weight_type", c_int)]


class ChatMessage(Structure):
    _fields_ = [("role", c_char_p), ("content", c_char_p)]


class SessionParams(Structure):
    _fields_ = [("n_ctx", c_uint32), ("seed", c_uint64), ("temperature", c_float),
                ("top_k", c_int32), ("top_p", c_float), ("draft", c_void_p),
                ("gamma_policy", c_int), ("gamma", c_int32), ("gamma_max", c_int32),
                ("sigmoid_verify", c_bool), ("sigmoid_alpha", c_float), ("sigmoid_beta", c_float),
                ("coupled_acceptance", c_bool), ("lookup_ngram", c_int32)]


class GenerateParams(Structure):
    _fields_ = [("max_tokens", c_int32), ("stop_at_eos", c_bool), ("on_token", token_fn),
                ("on_token_user_data", c_void_p), ("should_abort", abort_fn),
                ("should_abort_user_data", c_void_p)]


class SessionStats(Structure):
    _fields_ = [("n_past", c_uint32), ("n_prompt_tokens", c_uint64), ("n_generated", c_uint64),
                ("n_forward_calls", c_uint64), ("n_host_waits", c_uint64),
                ("prompt_seconds", c_double), ("generate_seconds", c_double),
                ("n_steps", c_uint64), ("n_drafted", c_uint64), ("n_accepted", c_uint64),
                ("n_evaluated", c_uint64), ("acceptance_rate", c_double),
                ("tokens_per_step", c_double), ("evaluated_at", c_uint64 * MAX_GAMMA),
                ("accepted_at", c_uint64 * MAX_GAMMA), ("draft_seconds", c_double),
                ("target_seconds", c_double), ("verify_seconds", c_double),
                ("last_gamma", c_int32), ("n_lookup_drafted", c_uint64),
                ("n_lookup_accepted", c_uint64), ("n_shared_steps", c_uint64)]


class AsrModelInfo(Structure):
    _fields_ = [("n_vocab", c_int32), ("n_audio_ctx", c_int32), ("n_audio_layer", c_int32),
                ("n_text_ctx", c_int32), ("n_text_layer", c_int32), ("n_state", c_int32),
                ("n_mels", c_int32), ("multilingual", c_bool), ("n_params", c_uint64),
                ("weight_type", c_int), ("n_output_tokens", c_int32)]


class AsrSegment(Structure):
    _fields_ = [("t0_ms", c_int64), ("t1_ms", c_int64), ("text", c_char_p)]


segment_fn = CFUNCTYPE(None, POINTER(AsrSegment), c_void_p)


class AsrParams(Structure):
    _fields_ = [("language", c_char_p), ("translate", c_bool), ("timestamps", c_bool),
                ("condition_on_previous_text", c_bool), ("temperature", c_float),
                ("temperature_increment", c_float), ("entropy_threshold", c_float),
                ("logprob_threshold", c_float), ("no_speech_threshold", c_float),
                ("seed", c_uint64), ("draft", c_void_p), ("gamma_policy", c_int),
                ("gamma", c_int32), ("gamma_max", c_int32), ("on_segment", segment_fn),
                ("segment_user_data", c_void_p), ("progress", progress_fn),
                ("progress_user_data", c_void_p)]


class AsrTimings(Structure):
    _fields_ = [("audio_seconds", c_double), ("mel_seconds", c_double),
                ("encode_seconds", c_double), ("decode_seconds", c_double),
                ("windows", c_int32), ("fallbacks", c_int32), ("tokens", c_int32),
                ("language", c_char * 8), ("n_steps", c_uint64), ("n_emitted", c_uint64),
                ("n_drafted", c_uint64), ("n_evaluated", c_uint64), ("n_accepted", c_uint64),
                ("draft_seconds", c_double), ("target_seconds", c_double),
                ("verify_seconds", c_double)]


class AsrStreamEvent(Structure):
    _fields_ = [("is_final", c_bool), ("t0_ms", c_int64), ("t1_ms", c_int64),
                ("text", c_char_p), ("stable_bytes", c_size_t)]


stream_event_fn = CFUNCTYPE(None, POINTER(AsrStreamEvent), c_void_p)


class AsrStreamParams(Structure):
    _fields_ = [("asr", AsrParams), ("vad_aggressiveness", c_int32), ("step_ms", c_int32),
                ("end_silence_ms", c_int32), ("pre_roll_ms", c_int32),
                ("max_utterance_ms", c_int32), ("on_event", stream_event_fn),
                ("event_user_data", c_void_p)]


STRUCTS = {"specula_device_info": DeviceInfo, "specula_backend_options": BackendOptions,
           "specula_backend_params": BackendParams,
           "specula_model_params": ModelParams, "specula_model_info": ModelInfo,
           "specula_chat_message": ChatMessage, "specula_session_params": SessionParams,
           "specula_generate_params": GenerateParams, "specula_session_stats": SessionStats,
           "specula_asr_model_info": AsrModelInfo, "specula_asr_segment": AsrSegment,
           "specula_asr_params": AsrParams, "specula_asr_timings": AsrTimings,
           "specula_asr_stream_event": AsrStreamEvent,
           "specula_asr_stream_params": AsrStreamParams}

_p = c_void_p
_FUNCTIONS = {
    "specula_last_error": (c_char_p, []),
    "specula_status_name": (c_char_p, [status_t]),
    "specula_version": (c_char_p, []),
    "specula_set_log_callback": (None, [log_fn, c_void_p]),
    "specula_backend_kind_from_name": (status_t, [c_char_p, POINTER(c_int)]),
    "specula_backend_kind_name": (c_char_p, [c_int]),
    "specula_device_count": (status_t, [POINTER(c_size_t)]),
    "specula_device_get": (status_t, [c_size_t, POINTER(DeviceInfo)]),
    "specula_backend_default_params_by_ref": (None, [POINTER(BackendParams)]),
    "specula_backend_create": (status_t, [POINTER(BackendParams), POINTER(_p)]),
    "specula_backend_free": (None, [_p]),
    "specula_backend_get_info": (status_t, [_p, POINTER(DeviceInfo)]),
    "specula_backend_available_memory": (status_t, [_p, POINTER(c_uint64)]),
    "specula_model_default_params_by_ref": (None, [POINTER(ModelParams)]),
    "specula_model_load": (status_t, [_p, c_char_p, POINTER(ModelParams), POINTER(_p)]),
    "specula_model_load_from_memory": (status_t, [_p, c_char_p, c_size_t, POINTER(ModelParams),
                                                  POINTER(_p)]),
    "specula_model_free": (None, [_p]),
    "specula_model_get_info": (status_t, [_p, POINTER(ModelInfo)]),
    "specula_tokenize": (status_t, [_p, c_char_p, c_size_t, c_uint32, POINTER(c_int32), c_size_t,
                                    POINTER(c_size_t)]),
    "specula_detokenize": (status_t, [_p, POINTER(c_int32), c_size_t, c_void_p, c_size_t,
                                      POINTER(c_size_t)]),
    "specula_token_text": (status_t, [_p, c_int32, c_void_p, c_size_t, POINTER(c_size_t)]),
    "specula_token_ends_generation": (c_bool, [_p, c_int32]),
    "specula_chat_apply_template": (status_t, [_p, c_char_p, POINTER(ChatMessage), c_size_t,
                                               c_bool, c_void_p, c_size_t, POINTER(c_size_t)]),
    "specula_gamma_policy_from_name": (status_t, [c_char_p, POINTER(c_int)]),
    "specula_session_default_params_by_ref": (None, [POINTER(SessionParams)]),
    "specula_generate_default_params_by_ref": (None, [POINTER(GenerateParams)]),
    "specula_session_create": (status_t, [_p, POINTER(SessionParams), POINTER(_p)]),
    "specula_session_free": (None, [_p]),
    "specula_session_reset": (status_t, [_p]),
    "specula_session_set_sampling": (status_t, [_p, c_float, c_int32, c_float, c_uint64]),
    "specula_session_eval": (status_t, [_p, POINTER(c_int32), c_size_t]),
    "specula_session_get_logits": (status_t, [_p, POINTER(c_float), c_size_t]),
    "specula_generate": (status_t, [_p, POINTER(GenerateParams), POINTER(c_int32), c_size_t,
                                    POINTER(c_size_t)]),
    "specula_session_get_stats": (status_t, [_p, POINTER(SessionStats)]),
    "specula_session_memory": (status_t, [_p, POINTER(c_uint64), POINTER(c_uint64)]),
    "specula_asr_model_load": (status_t, [_p, c_char_p, POINTER(ModelParams), POINTER(_p)]),
    "specula_asr_draft_load": (status_t, [_p, c_char_p, POINTER(ModelParams), POINTER(c_int32),
                                          c_size_t, POINTER(_p)]),
    "specula_asr_model_free": (None, [_p]),
    "specula_asr_model_get_info": (status_t, [_p, POINTER(AsrModelInfo)]),
    "specula_asr_default_params_by_ref": (None, [POINTER(AsrParams)]),
    "specula_asr_context_create": (status_t, [_p, POINTER(_p)]),
    "specula_asr_context_free": (None, [_p]),
    "specula_asr_transcribe": (status_t, [_p, POINTER(c_float), c_size_t, POINTER(AsrParams)]),
    "specula_asr_transcribe_file": (status_t, [_p, c_char_p, POINTER(AsrParams)]),
    "specula_asr_transcribe_memory": (status_t, [_p, c_void_p, c_size_t, POINTER(AsrParams)]),
    "specula_asr_segment_count": (c_size_t, [_p]),
    "specula_asr_get_segment": (status_t, [_p, c_size_t, POINTER(AsrSegment)]),
    "specula_asr_get_timings": (status_t, [_p, POINTER(AsrTimings)]),
    "specula_asr_stream_default_params_by_ref": (None, [POINTER(AsrStreamParams)]),
    "specula_asr_stream_create": (status_t, [_p, POINTER(AsrStreamParams), POINTER(_p)]),
    "specula_asr_stream_push": (status_t, [_p, POINTER(c_float), c_size_t, c_int32]),
    "specula_asr_stream_push_pcm16": (status_t, [_p, c_void_p, c_size_t, c_int32]),
    "specula_asr_stream_finish": (status_t, [_p]),
    "specula_asr_stream_get_timings": (status_t, [_p, POINTER(AsrTimings)]),
    "specula_asr_stream_free": (None, [_p]),
}


def _candidates():
    """Where libspecula is looked for: $SPECULA_LIBRARY, then the loader's search path."""
    explicit = os.environ.get("SPECULA_LIBRARY")
    if explicit:
        return [explicit]
    found = ctypes.util.find_library("specula")
    names = [found] if found else []
    return names + ["libspecula.so", "libspecula.dylib"]


def load():
    errors = []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError as e:
            errors.append(f"{name}: {e}")
            continue
        for fn, (restype, argtypes) in _FUNCTIONS.items():
            f = getattr(lib, fn)
            f.restype, f.argtypes = restype, argtypes
        return lib
    raise ImportError("libspecula was not found (set SPECULA_LIBRARY to its path, or install it "
                      "where the dynamic loader looks): " + "; ".join(errors))


lib = load()
