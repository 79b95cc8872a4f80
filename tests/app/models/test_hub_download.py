"""Downloads from the Hugging Face Hub through huggingface_hub, against a real HTTP server
on loopback in the hub's URL layout (HF_ENDPOINT points at it): the file list, a complete
download, a resumed one, a corrupted one refused, a server that drops mid-file."""

from __future__ import annotations

import hashlib
import threading

import pytest

from app.models.hub_download import (
    DownloadCancelled,
    HubClient,
    HubError,
    HubSource,
    choices_for,
    parse_source,
)
from tests.app.models.hub_server import FakeHub, serve

REPO = "someone/Tiny-GGUF"
Q4 = bytes(range(256)) * 40  # 10,240 bytes
Q8 = bytes(reversed(range(256))) * 80
README = b"# Tiny\n"
BIG = hashlib.sha256(b"big").digest() * (1 << 17)  # 4 MiB: it arrives in many reads


def serve_repos(monkeypatch):
    """The loopback hub with this module's repos, HF_ENDPOINT pointed at it."""
    fake = FakeHub(
        {
            REPO: {"tiny.Q4_K_M.gguf": Q4, "tiny.Q8_0.gguf": Q8, "README.md": README},
            "someone/Big-GGUF": {"big.Q2_K.gguf": BIG},
            "someone/Tiny-MLX": {
                "config.json": b'{"model_type": "llama"}',
                "model.safetensors": Q4,
                "tokenizer.json": b"{}" * 40,
                "README.md": README,
            },
        }
    )
    server, thread = serve(fake)
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield fake
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def hub(monkeypatch):
    yield from serve_repos(monkeypatch)


def q4_choice(client):
    choices = choices_for(client.list_files(HubSource(REPO)))
    return next(c for c in choices if c.quantization == "Q4_K_M")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("someone/Tiny-GGUF", HubSource(REPO)),
        ("https://huggingface.co/someone/Tiny-GGUF", HubSource(REPO)),
        ("huggingface.co/someone/Tiny-GGUF/tree/dev", HubSource(REPO, "dev")),
        (
            "https://huggingface.co/someone/Tiny-GGUF/resolve/main/tiny.Q4_K_M.gguf?download=true",
            HubSource(REPO, "main", "tiny.Q4_K_M.gguf"),
        ),
        (
            "https://hf.co/someone/Tiny-GGUF/blob/main/sub/tiny.Q8_0.gguf",
            HubSource(REPO, "main", "sub/tiny.Q8_0.gguf"),
        ),
    ],
)
def test_pasted_repo_ids_and_urls(text, expected):
    assert parse_source(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "just-a-name", "https://example.com/"])
def test_what_is_not_a_repo_gets_a_message(text):
    with pytest.raises(ValueError, match="repo id"):
        parse_source(text)


def test_the_file_list_shows_each_gguf_and_a_model_folder(hub):
    client = HubClient()
    assert client.endpoint == hub.endpoint  # from HF_ENDPOINT
    choices = choices_for(client.list_files(HubSource(REPO)))
    assert [(c.label, c.quantization, c.size) for c in choices] == [
        ("tiny.Q4_K_M.gguf", "Q4_K_M", len(Q4)),
        ("tiny.Q8_0.gguf", "Q8_0", len(Q8)),
    ]
    assert choices[0].files[0].sha256 == hashlib.sha256(Q4).hexdigest()
    folder = choices_for(client.list_files(HubSource("someone/Tiny-MLX")))
    assert [(c.label, c.is_folder) for c in folder] == [("Model folder (safetensors)", True)]
    assert sorted(f.path for f in folder[0].files) == [
        "config.json", "model.safetensors", "tokenizer.json",
    ]  # fmt: skip


def test_a_missing_repo_says_so(hub):
    with pytest.raises(HubError, match="No model repo “someone/nothing”"):
        HubClient().list_files(HubSource("someone/nothing"))


def test_a_complete_download_lands_in_the_models_folder_checked(hub, tmp_path):
    client = HubClient()
    seen: list[tuple[int, int]] = []
    path = client.download(
        HubSource(REPO), q4_choice(client), tmp_path, progress=lambda d, t: seen.append((d, t))
    )
    assert path == tmp_path / "someone" / "Tiny-GGUF" / "tiny.Q4_K_M.gguf"
    assert path.read_bytes() == Q4
    assert seen[-1] == (len(Q4), len(Q4)) and all(t == len(Q4) for _d, t in seen)
    assert sorted(p.name for p in path.parent.iterdir()) == ["tiny.Q4_K_M.gguf"]  # no leftovers
    resolves = [r for r in hub.requests if "/resolve/" in r[1]]
    assert resolves and resolves[0][0] == "HEAD"  # huggingface_hub's metadata call


def test_the_token_goes_to_the_hub_and_never_to_the_cdn(hub, tmp_path):
    client = HubClient(token="hf_secret")
    client.download(HubSource(REPO), q4_choice(client), tmp_path)
    auth = {path: header for _verb, path, header in hub.auth}
    assert auth[f"/{REPO}/resolve/main/tiny.Q4_K_M.gguf"] == "Bearer hf_secret"
    assert auth[f"/cdn/{REPO}/tiny.Q4_K_M.gguf"] is None


def test_a_dropped_connection_keeps_the_part_and_the_next_try_resumes(hub, tmp_path):
    client = HubClient()
    choice = q4_choice(client)
    hub.drop_after["tiny.Q4_K_M.gguf"] = 4000
    with pytest.raises(HubError, match="dropped after.*The part is kept"):
        client.download(HubSource(REPO), choice, tmp_path)
    folder = tmp_path / "someone" / "Tiny-GGUF"
    part = folder / "tiny.Q4_K_M.gguf.part"
    assert part.read_bytes() == Q4[:4000]
    assert not (folder / "tiny.Q4_K_M.gguf").exists()

    del hub.drop_after["tiny.Q4_K_M.gguf"]
    hub.requests.clear()
    path = client.download(HubSource(REPO), choice, tmp_path)
    assert path.read_bytes() == Q4 and not part.exists()
    gets = [r for r in hub.requests if r[0] == "GET" and r[1].startswith("/cdn/")]
    assert gets == [("GET", f"/cdn/{REPO}/tiny.Q4_K_M.gguf", "bytes=4000-")]


def test_a_corrupted_download_is_refused_and_deleted(hub, tmp_path):
    client = HubClient()
    hub.corrupt.add("tiny.Q4_K_M.gguf")
    with pytest.raises(HubError, match="corrupt: its sha256"):
        client.download(HubSource(REPO), q4_choice(client), tmp_path)
    folder = tmp_path / "someone" / "Tiny-GGUF"
    assert not folder.exists() or list(folder.iterdir()) == []


def test_a_corrupted_resume_is_caught_too(hub, tmp_path):
    """A part that went bad on disk: the hash covers the kept bytes as well."""
    client = HubClient()
    choice = q4_choice(client)
    hub.drop_after["tiny.Q4_K_M.gguf"] = 3000
    with pytest.raises(HubError):
        client.download(HubSource(REPO), choice, tmp_path)
    part = tmp_path / "someone" / "Tiny-GGUF" / "tiny.Q4_K_M.gguf.part"
    part.write_bytes(b"\0" * 3000)
    del hub.drop_after["tiny.Q4_K_M.gguf"]
    with pytest.raises(HubError, match="corrupt"):
        client.download(HubSource(REPO), choice, tmp_path)
    assert not part.exists()
    assert client.download(HubSource(REPO), choice, tmp_path).read_bytes() == Q4


def test_a_cancel_stops_and_keeps_the_part(hub, tmp_path):
    client = HubClient()
    source = HubSource("someone/Big-GGUF")
    (choice,) = choices_for(client.list_files(source))
    cancel = threading.Event()

    def progress(done, _total):
        if done > 0:
            cancel.set()

    with pytest.raises(DownloadCancelled):
        client.download(source, choice, tmp_path, progress, cancel)
    part = tmp_path / "someone" / "Big-GGUF" / "big.Q2_K.gguf.part"
    assert 0 < part.stat().st_size < len(BIG)
    assert BIG.startswith(part.read_bytes())


def test_a_model_folder_downloads_every_file(hub, tmp_path):
    client = HubClient()
    source = HubSource("someone/Tiny-MLX")
    (choice,) = choices_for(client.list_files(source))
    folder = client.download(source, choice, tmp_path)
    assert folder == tmp_path / "someone" / "Tiny-MLX"
    assert (folder / "model.safetensors").read_bytes() == Q4
    assert (folder / "config.json").read_bytes() == b'{"model_type": "llama"}'
    assert not (folder / "README.md").exists()


def test_a_download_that_cannot_fit_is_refused_before_it_starts(hub, tmp_path, monkeypatch):
    import app.models.hub_download as hub_download

    client = HubClient()
    choice = q4_choice(client)
    usage = hub_download.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(
        hub_download.shutil, "disk_usage", lambda _path: usage._replace(free=len(Q4) - 1)
    )
    with pytest.raises(HubError, match="needs 10.2 kB more and .* has 10.2 kB free"):
        client.download(HubSource(REPO), choice, tmp_path)
    assert not [r for r in hub.requests if r[1].startswith("/cdn/")]  # nothing was fetched
