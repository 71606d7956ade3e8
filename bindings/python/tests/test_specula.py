"""The Python bindings on the bundled models: exactness through the bindings, streaming and
stopping, errors as exceptions, ownership, speech. SPECULA_LIBRARY names the shared library;
SPECULA_LAYOUT_PROBE the program that prints the C structs' layout (layout_probe.c)."""

import ctypes
import os
import subprocess
import wave
from pathlib import Path

import pytest

import specula
from specula import _capi

ROOT = Path(__file__).resolve().parents[3]
TARGET = ROOT / "examples/models/specula-demo-target.gguf"
DRAFT = ROOT / "examples/models/specula-demo-draft.gguf"
WHISPER = ROOT / "examples/models/specula-whisper-target.bin"
WHISPER_DRAFT = ROOT / "examples/models/specula-whisper-draft.bin"
SPEECH = ROOT / "examples/audio/held-out-sentence.wav"
PROMPT = "The json module can be used to"


@pytest.fixture(scope="module")
def backend():
    with specula.Backend("cpu", n_threads=2) as b:
        yield b


@pytest.fixture(scope="module")
def target(backend):
    with specula.Model(TARGET, backend=backend) as m:
        yield m


@pytest.fixture(scope="module")
def draft(backend):
    with specula.Model(DRAFT, backend=backend) as m:
        yield m


def test_the_ctypes_structs_are_the_c_compilers():
    probe = os.environ.get("SPECULA_LAYOUT_PROBE")
    if not probe:
        pytest.skip("SPECULA_LAYOUT_PROBE not set")
    seen = 0
    for line in subprocess.run([probe], check=True, capture_output=True, text=True).stdout.split("\n"):
        if not line:
            continue
        name, value = line.split()
        if "." in name:
            struct, field = name.split(".")
            assert getattr(_capi.STRUCTS[struct], field).offset == int(value), name
        else:
            assert ctypes.sizeof(_capi.STRUCTS[name]) == int(value), name
        seen += 1
    assert seen == len(_capi.STRUCTS) + sum(len(s._fields_) for s in _capi.STRUCTS.values())


def test_version_and_devices():
    assert specula.version() == "0.1.0"
    devices = specula.devices()
    assert devices[0].kind == "cpu"


def test_tokens_round_trip(target):
    tokens = target.tokenize(PROMPT)
    assert tokens[0] == target.info.bos_token
    assert target.tokenize(PROMPT, add_bos=False) == tokens[1:]
    assert target.detokenize(tokens) == PROMPT
    assert "".join(target.token_text(t) for t in tokens[1:]).replace("\u2581", " ").strip() == PROMPT
    assert target.ends_generation(target.info.eos_token)
    long_text = "json " * 2000  # more tokens than the first buffer holds
    assert target.detokenize(target.tokenize(long_text, add_bos=False)) == long_text


def generate(model, prompt=PROMPT, n=64, **params):
    with model.session(**params) as s:
        tokens = list(s.tokens(prompt, max_tokens=n, stop_at_eos=False))
        return tokens, s.stats


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "seed": 7}])
def test_speculative_output_is_the_targets(target, draft, sampling):
    alone, _ = generate(target, **sampling)
    paired, stats = generate(target, draft=draft, **sampling)
    looked_up, lookup_stats = generate(target, lookup_ngram=3, **sampling)
    assert paired == alone and looked_up == alone
    assert len(alone) == 64
    assert stats.n_drafted > 0 and 0 < stats.acceptance_rate <= 1
    assert stats.tokens_per_step > 1
    assert lookup_stats.n_lookup_drafted == lookup_stats.n_drafted


def test_set_sampling_generates_what_a_new_session_would(target, draft):
    sampled, _ = generate(target, draft=draft, temperature=0.8, top_k=40, top_p=0.95, seed=7)
    with target.session(draft=draft) as s:
        s.set_sampling(temperature=0.8, top_k=40, top_p=0.95, seed=7)
        assert list(s.tokens(PROMPT, max_tokens=64, stop_at_eos=False)) == sampled
        with pytest.raises(specula.SpeculaError):
            s.set_sampling(temperature=-1.0)


def test_text_pieces_make_the_detokenized_text(target, draft):
    with target.session(draft=draft) as s:
        text = "".join(s.generate(PROMPT, max_tokens=40, stop_at_eos=False))
    tokens, _ = generate(target, n=40)
    assert text == target.detokenize(tokens)


def test_leaving_the_loop_stops_after_the_last_token_seen(target, draft):
    with target.session(draft=draft) as s:
        prompt = target.tokenize(PROMPT)
        seen = []
        for token in s.tokens(prompt, max_tokens=100):
            seen.append(token)
            if len(seen) == 7:
                break
        assert s.stats.n_generated == 7
        # The run goes on where it stopped: the same tokens as one run of the target alone.
        seen += list(s.tokens(max_tokens=20, stop_at_eos=False))
    alone, _ = generate(target, n=27)
    assert seen == alone


def test_errors_are_exceptions_with_the_status(tmp_path, backend, target):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(TARGET.read_bytes()[:100000])
    with pytest.raises(specula.SpeculaError) as e:
        specula.Model(truncated, backend=backend)
    assert e.value.status == specula.Status.ERR_FORMAT and e.value.message
    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(b"GGUX" + TARGET.read_bytes()[4:4096])
    with pytest.raises(specula.SpeculaError) as e:
        specula.Model(wrong, backend=backend)
    assert e.value.status == specula.Status.ERR_FORMAT
    with pytest.raises(specula.SpeculaError) as e:
        specula.Model(tmp_path / "absent.gguf", backend=backend)
    assert e.value.status == specula.Status.ERR_IO
    with pytest.raises(specula.SpeculaError) as e:
        target.session(gamma_policy="greedy")
    assert e.value.status == specula.Status.ERR_INVALID_ARGUMENT
    with pytest.raises(specula.SpeculaError) as e:
        specula.Backend("metal")
    assert e.value.status == specula.Status.ERR_INVALID_ARGUMENT
    with pytest.raises(specula.SpeculaError) as e:
        specula.Model(TARGET, backend=backend, progress=lambda fraction: fraction < 0.5)
    assert e.value.status == specula.Status.ERR_ABORTED
    with target.session(n_ctx=16) as s:
        with pytest.raises(specula.SpeculaError) as e:
            list(s.generate(PROMPT, max_tokens=64, stop_at_eos=False))
        assert e.value.status == specula.Status.ERR_CONTEXT_FULL
    # Nothing loaded was lost.
    assert generate(target, n=8)[0] == generate(target, n=8)[0]


def test_closing_a_backend_closes_what_was_made_from_it():
    b = specula.Backend("cpu", n_threads=1)
    m = specula.Model(TARGET, backend=b)
    s = m.session()
    b.close()
    assert m.closed and s.closed
    with pytest.raises(specula.SpeculaError) as e:
        s.eval(PROMPT)
    assert e.value.status == specula.Status.ERR_INVALID_ARGUMENT
    s.close()  # twice is harmless
    with specula.Model(TARGET, backend="cpu") as own:  # a backend of its own, closed with it
        assert not own.backend.closed
    assert own.backend.closed


def test_a_model_from_memory_is_the_file(backend, target):
    with specula.Model(data=TARGET.read_bytes(), backend=backend) as m, m.session() as a, \
            target.session() as b:
        a.eval(PROMPT)
        b.eval(PROMPT)
        assert a.logits() == b.logits()
        assert len(a.logits()) == m.info.n_vocab


def test_chat_template_by_name(target):
    text = target.apply_chat_template([{"role": "user", "content": "Hi"}], template="chatml")
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def read_wav(path):
    with wave.open(str(path)) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        frames = w.readframes(w.getnframes())
    return [int.from_bytes(frames[i:i + 2], "little", signed=True) / 32768 for i in range(0, len(frames), 2)]


def test_transcription_of_a_file_samples_and_with_a_draft(backend):
    with specula.AsrModel(WHISPER, backend=backend) as model, \
            specula.AsrModel(WHISPER_DRAFT, backend=backend) as draft, model.transcriber() as t:
        streamed = []
        from_file = t.transcribe(SPEECH, on_segment=streamed.append)
        assert from_file and streamed == from_file
        assert "".join(s.text for s in from_file).strip()
        assert 0 <= from_file[0].start < from_file[-1].end <= 4.0
        samples = read_wav(SPEECH)
        assert t.transcribe(samples) == from_file
        with open(SPEECH, "rb") as f:
            assert t.transcribe(f.read()) == from_file
        try:
            import numpy as np
            assert t.transcribe(np.array(samples, dtype=np.float64)) == from_file
        except ImportError:
            pass
        assert t.transcribe(SPEECH, draft=draft) == from_file
        timings = t.timings
        assert timings.n_drafted > 0 and timings.language == "en"
        with pytest.raises(specula.SpeculaError) as e:
            t.transcribe(SPEECH, progress=lambda fraction: False)
        assert e.value.status == specula.Status.ERR_ABORTED
        draft.close()
        assert t.closed  # it held the draft's caches


def test_a_stream_of_the_clip_between_silences(backend):
    with specula.AsrModel(WHISPER, backend=backend) as model, model.transcriber() as t:
        alone = "".join(s.text for s in t.transcribe(SPEECH))
        events = []
        silence = [0.0] * 16000
        samples = silence + read_wav(SPEECH) + silence
        with t.stream(events.append) as stream:
            with pytest.raises(specula.SpeculaError) as e:
                t.transcribe(SPEECH)  # the stream holds the transcriber
            assert e.value.status == specula.Status.ERR_INVALID_ARGUMENT
            for i in range(0, len(samples), 320):
                stream.push(samples[i:i + 320])
            stream.finish()
            assert stream.timings.audio_seconds == pytest.approx(len(samples) / 16000)
            with pytest.raises(specula.SpeculaError):
                stream.push(silence)  # after finish
        finals = [e for e in events if e.final]
        assert finals and any(not e.final for e in events)
        assert 0.9 < finals[0].start and finals[-1].end < len(samples) / 16000
        heard = "".join(e.text for e in finals)
        assert set(heard.lower().split()) & set(alone.lower().split())
        for e in events:
            assert e.text.startswith(e.stable)
        # 16-bit bytes at another rate, resampled as they come: the same number of utterances.
        events.clear()
        with t.stream(events.append) as stream:
            pcm = b"".join(int(x * 32767).to_bytes(2, "little", signed=True) for x in samples)
            stream.push(pcm, 16000)
            stream.finish()
        assert "".join(e.text for e in events if e.final) == heard


def test_backend_options_reach_the_backend():
    # The demo target is quantized: the cpu multiplies it by 8-bit inputs unless told not to,
    # which rounds its logits otherwise.
    with pytest.raises(TypeError):
        specula.Backend("cpu", no_such_option=True)
    logits = []
    for int8_inputs in (True, False):
        with specula.Backend("cpu", n_threads=1, int8_inputs=int8_inputs) as b:
            with specula.Model(TARGET, backend=b) as m, m.session() as s:
                s.eval(PROMPT)
                logits.append(s.logits())
    assert logits[0] != logits[1]
