"""A small Hugging Face Hub on 127.0.0.1 for tests: enough of the HTTP API for huggingface_hub 2.4.

Implemented (the requests huggingface_hub 2.4 sends, read from its ``hf_api.py``, ``_commit_api.py``,
``lfs.py``, ``file_download.py`` and ``_snapshot_download.py``):

- ``POST /api/repos/create``                           create_repo (JSON: name, organization, type, sdk, visibility)
- ``POST /api/validate-yaml``                          README.md metadata check done by create_commit/upload_folder
- ``POST /api/{type}s/{id}/preupload/{rev}``           upload mode per file: "lfs" for weights/binary, else "regular"
- ``POST /{prefix}{id}.git/info/lfs/objects/batch``    LFS batch API ("basic" transfer; upload + verify actions)
- ``PUT  /__lfs/{oid}``, ``POST /__lfs/{oid}/verify``  where the batch answer sends LFS bytes (presigned-URL stand-in)
- ``POST /api/{type}s/{id}/commit/{rev}``              NDJSON commit: header, file (base64), lfsFile, deleted*
- ``GET  /api/{type}s/{id}[/revision/{rev}]``          repo info (id, sha, siblings, private, sdk)
- ``GET  /api/{type}s/{id}/tree/{rev}[/{path}]``       file listing for snapshot_download (``recursive``)
- ``HEAD|GET /{prefix}{id}/resolve/{rev}/{path}``      file download with X-Repo-Commit, ETag, Content-Length
- ``GET  /api/whoami-v2``

Errors carry the ``X-Error-Code`` header (RepoNotFound, RevisionNotFound, EntryNotFound) that
huggingface_hub turns into its typed exceptions. Writes need ``Authorization: Bearer <token>`` with a
token the server was given; private repos need it for reads too. Files live on disk under
``root/<type>s/<namespace>/<name>/`` and LFS objects under ``root/lfs/``; commit metadata and the
accepted tokens stay in memory, so no token is ever written to disk. Every request's method, path
and headers are recorded in ``FakeHub.requests`` (in memory only) for the tests to inspect.
Only the ``main`` branch and the current commit id are known revisions; there is no history.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

REPO_TYPES = ("model", "dataset", "space")
URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/"}
# Like the Hub's default .gitattributes: weights and archives go to LFS whatever their size.
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".npy", ".npz", ".gguf", ".zip", ".gz", ".tar")
LFS_MIN_SIZE = 10 * 1024 * 1024  # the Hub sends files above 10 MB to LFS
_ID = r"(?P<ns>[\w.-]+)/(?P<name>[\w.-]+)"


def git_blob_oid(data: bytes) -> str:
    """git's object id of a blob: sha1(b"blob <size>\\0" + data)."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def files_containing(root: str | Path, needle: str) -> list[str]:
    """Every regular file under ``root`` whose bytes contain ``needle`` (for the token-leak checks)."""
    data = needle.encode()
    return [str(p) for p in Path(root).rglob("*") if p.is_file() and not p.is_symlink() and data in p.read_bytes()]


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case


@dataclass
class _Repo:
    repo_type: str
    repo_id: str
    private: bool
    sdk: str | None
    sha: str
    lfs: dict[str, str] = field(default_factory=dict)  # path -> sha256 of the files stored in LFS


class FakeHub:
    """Threaded HTTP server on 127.0.0.1 (free port) serving the Hub endpoints listed in the module docstring.

    Use as a context manager or call ``start()`` / ``stop()``. ``tokens`` maps each accepted token to
    its user name; ``lfs=False`` answers every preupload with "regular" (files inline in the commit).
    """

    def __init__(self, root: str | Path, *, tokens: dict[str, str], lfs: bool = True):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._tokens = dict(tokens)
        self.lfs = lfs
        self.repos: dict[tuple[str, str], _Repo] = {}
        self.requests: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> "FakeHub":
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- storage ---------------------------------------------------------------------------------
    def repo_dir(self, repo_id: str, repo_type: str = "model") -> Path:
        """Where the files of a repo are stored (the tests read what arrived here)."""
        return self.root / f"{repo_type}s" / repo_id

    def stored_files(self, repo_id: str, repo_type: str = "model") -> dict[str, bytes]:
        """Path in repo → content of every file of the repo's current commit (LFS files resolved)."""
        repo = self.repos[(repo_type, repo_id)]
        base = self.repo_dir(repo_id, repo_type)
        return {p: self._read(repo, base, p) for p in self._paths(base)}

    def _read(self, repo: _Repo, base: Path, path: str) -> bytes:
        if path in repo.lfs:
            return (self.root / "lfs" / repo.lfs[path]).read_bytes()
        return (base / path).read_bytes()

    @staticmethod
    def _paths(base: Path) -> list[str]:
        return sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file())


class _Error(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects; every answer sets Content-Length
    fake: FakeHub

    def log_message(self, format, *args):  # quiet: the tests read FakeHub.requests instead
        pass

    # -- plumbing --------------------------------------------------------------------------------
    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        self.route, self.query = unquote(split.path), parse_qs(split.query)
        with self.fake._lock:
            headers = {k.lower(): v for k, v in self.headers.items()}
            self.fake.requests.append(RecordedRequest(method, self.path, headers))
        body = self._read_body()
        try:
            for verb, pattern, handler in _ROUTES:
                match = re.fullmatch(pattern, self.route)
                if verb == method and match:
                    with self.fake._lock:
                        return handler(self, body=body, **match.groupdict())
            raise _Error(404, f"no route for {method} {self.route}")
        except _Error as err:
            headers = {"X-Error-Message": err.message, **err.headers}
            if err.code:
                headers["X-Error-Code"] = err.code
            self._send(err.status, {"error": err.message}, headers=headers, head=method == "HEAD")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _send(self, status: int, payload, *, headers: dict | None = None, head: bool = False,
              content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    # -- helpers ---------------------------------------------------------------------------------
    def _user(self, required: bool) -> str | None:
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        user = self.fake._tokens.get(token) if token else None
        if required and user is None:
            raise _Error(401, "Invalid credentials in Authorization header")
        return user

    def _repo(self, repo_type: str, ns: str, name: str, *, write: bool = False, rev: str | None = None) -> _Repo:
        repo = self.fake.repos.get((repo_type, f"{ns}/{name}"))
        user = self._user(required=write)
        if repo is None or (repo.private and user != ns):
            raise _Error(404, "Repository not found", "RepoNotFound")
        if write and user != ns:
            raise _Error(403, f"You don't have the rights to write to {ns}/{name}")
        if rev is not None and rev not in ("main", repo.sha):
            raise _Error(404, f"Invalid rev id: {rev}", "RevisionNotFound", {"X-Repo-Commit": repo.sha})
        return repo

    def _repo_base(self, repo: _Repo) -> Path:
        return self.fake.repo_dir(repo.repo_id, repo.repo_type)

    # -- endpoints -------------------------------------------------------------------------------
    def whoami(self, body):
        self._send(200, {"type": "user", "name": self._user(required=True)})

    def create_repo(self, body):
        user = self._user(required=True)
        payload = json.loads(body)
        repo_type = payload.get("type") or "model"
        namespace = payload.get("organization") or user
        if repo_type not in REPO_TYPES:
            raise _Error(400, f"invalid repo type {repo_type!r}")
        if namespace != user:
            raise _Error(403, f"You don't have the rights to create a repo under {namespace}")
        if repo_type == "space" and payload.get("sdk") not in ("gradio", "docker", "static"):
            raise _Error(400, "a Space needs an sdk")
        repo_id = f"{namespace}/{payload['name']}"
        url = f"{self.fake.url}/{URL_PREFIXES[repo_type]}{repo_id}"
        if (repo_type, repo_id) in self.fake.repos:
            raise _Error(409, "You already created this repo", headers={"X-Repo-Url": url})
        self.fake.repos[(repo_type, repo_id)] = _Repo(
            repo_type, repo_id, payload.get("visibility") == "private", payload.get("sdk"),
            sha=hashlib.sha1(f"init {repo_type} {repo_id}".encode()).hexdigest(),
        )
        self.fake.repo_dir(repo_id, repo_type).mkdir(parents=True)
        self._send(200, {"url": url, "name": repo_id, "id": repo_id})

    def validate_yaml(self, body):
        content = json.loads(body)["content"]
        match = re.match(r"^---\s*\n(.*?)\n---\s*\n", content, flags=re.S)
        try:
            meta = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as err:
            raise _Error(400, "invalid YAML") from err
        if meta is not None and not isinstance(meta, dict):
            self._send(400, {"errors": [{"message": "metadata must be a mapping"}], "warnings": []})
            return
        warnings = [] if meta else [{"message": "empty or missing yaml metadata in repo card"}]
        self._send(200, {"errors": [], "warnings": warnings})

    def info(self, body, rtype, ns, name, rev=None):
        repo = self._repo(rtype, ns, name, rev=rev)
        paths = self.fake._paths(self._repo_base(repo))
        info = {"id": repo.repo_id, "sha": repo.sha, "private": repo.private,
                "siblings": [{"rfilename": p} for p in paths]}
        if repo.repo_type == "space":
            info["sdk"] = repo.sdk
        self._send(200, info)

    def tree(self, body, rtype, ns, name, rev, path=None):
        repo = self._repo(rtype, ns, name, rev=rev)
        base = self._repo_base(repo)
        recursive = self.query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{path.strip('/')}/" if path else ""
        entries, folders = [], set()
        for p in self.fake._paths(base):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):]
            if "/" in rest:
                parts = rest.split("/")
                depth = len(parts) - 1 if recursive else 1
                folders.update(prefix + "/".join(parts[:i]) for i in range(1, depth + 1))
                if not recursive:
                    continue
            data = (base / p).read_bytes()
            entry = {"type": "file", "path": p, "size": len(data), "oid": git_blob_oid(data)}
            if p in repo.lfs:
                sha256 = repo.lfs[p]
                size = (self.fake.root / "lfs" / sha256).stat().st_size
                entry.update(size=size, lfs={"oid": sha256, "size": size, "pointerSize": len(data)})
            entries.append(entry)
        entries += [{"type": "directory", "path": f, "oid": hashlib.sha1(f.encode()).hexdigest()}
                    for f in sorted(folders)]
        self._send(200, entries)

    def preupload(self, body, rtype, ns, name, rev):
        repo = self._repo(rtype, ns, name, write=True, rev=rev)
        base = self._repo_base(repo)
        files = []
        for f in json.loads(body)["files"]:
            sample = base64.b64decode(f["sample"])
            lfs = self.fake.lfs and (f["path"].endswith(LFS_SUFFIXES) or f["size"] >= LFS_MIN_SIZE or b"\x00" in sample)
            oid = None
            if f["path"] in repo.lfs:
                oid = repo.lfs[f["path"]]
            elif (base / f["path"]).is_file():
                oid = git_blob_oid((base / f["path"]).read_bytes())
            files.append({"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False,
                          "oid": oid})
        self._send(200, {"files": files, "commitOid": repo.sha})

    def lfs_batch(self, body, prefix, ns, name):
        rtype = {"": "model", "datasets/": "dataset", "spaces/": "space"}[prefix or ""]
        self._repo(rtype, ns, name, write=True)
        payload = json.loads(body)
        if payload.get("operation") != "upload":
            raise _Error(400, "only the upload operation is implemented")
        objects = []
        for obj in payload["objects"]:
            answer = {"oid": obj["oid"], "size": obj["size"], "authenticated": True}
            if not (self.fake.root / "lfs" / obj["oid"]).is_file():
                href = f"{self.fake.url}/__lfs/{obj['oid']}"
                answer["actions"] = {"upload": {"href": href}, "verify": {"href": f"{href}/verify"}}
            objects.append(answer)
        self._send(200, {"transfer": "basic", "objects": objects}, content_type="application/vnd.git-lfs+json")

    def lfs_put(self, body, oid):
        if hashlib.sha256(body).hexdigest() != oid:
            raise _Error(400, "content does not match the sha256 oid")
        store = self.fake.root / "lfs"
        store.mkdir(exist_ok=True)
        (store / oid).write_bytes(body)
        self._send(200, b"", content_type="text/plain")

    def lfs_verify(self, body, oid):
        self._user(required=True)
        obj = self.fake.root / "lfs" / oid
        if not obj.is_file() or obj.stat().st_size != json.loads(body)["size"]:
            raise _Error(404, f"LFS object {oid} was not uploaded")
        self._send(200, {})

    def commit(self, body, rtype, ns, name, rev):
        repo = self._repo(rtype, ns, name, write=True, rev=rev)
        base = self._repo_base(repo)
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise _Error(400, "the commit payload must start with a header line")
        for item in lines[1:]:
            value = item["value"]
            path = value["path"].strip("/")
            if ".." in path.split("/"):
                raise _Error(400, f"invalid path {path!r}")
            target = base / path
            if item["key"] == "file":
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(base64.b64decode(value["content"]))
                repo.lfs.pop(path, None)
            elif item["key"] == "lfsFile":
                obj = self.fake.root / "lfs" / value["oid"]
                if not obj.is_file():
                    raise _Error(400, f"LFS object {value['oid']} of {path} was never uploaded")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(lfs_pointer(value["oid"], obj.stat().st_size))
                repo.lfs[path] = value["oid"]
            elif item["key"] == "deletedFile":
                if not target.is_file():
                    raise _Error(404, "A file with this name doesn't exist", "EntryNotFound")
                target.unlink()
                repo.lfs.pop(path, None)
            elif item["key"] == "deletedFolder":
                shutil.rmtree(target, ignore_errors=True)
                repo.lfs = {p: o for p, o in repo.lfs.items() if not p.startswith(f"{path}/")}
            else:
                raise _Error(400, f"unsupported commit operation {item['key']!r}")
        repo.sha = hashlib.sha1(repo.sha.encode() + body).hexdigest()
        url = f"{self.fake.url}/{URL_PREFIXES[repo.repo_type]}{repo.repo_id}/commit/{repo.sha}"
        self._send(200, {"commitUrl": url, "commitOid": repo.sha, "pullRequestUrl": None})

    def resolve(self, body, prefix, ns, name, rev, path):
        rtype = {"": "model", "datasets/": "dataset", "spaces/": "space"}[prefix or ""]
        repo = self._repo(rtype, ns, name, rev=rev)
        base = self._repo_base(repo)
        head = self.command == "HEAD"
        if not (base / path).is_file():
            raise _Error(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": repo.sha})
        data = self.fake._read(repo, base, path)
        etag = repo.lfs.get(path) or git_blob_oid((base / path).read_bytes())
        headers = {"X-Repo-Commit": repo.sha, "ETag": f'"{etag}"'}
        self._send(200, data, headers=headers, head=head, content_type="application/octet-stream")


_T = r"(?P<rtype>model|dataset|space)s"
_ROUTES = [
    ("GET", r"/api/whoami-v2", _Handler.whoami),
    ("POST", r"/api/repos/create", _Handler.create_repo),
    ("POST", r"/api/validate-yaml", _Handler.validate_yaml),
    ("GET", rf"/api/{_T}/{_ID}(?:/revision/(?P<rev>[^/]+))?", _Handler.info),
    ("GET", rf"/api/{_T}/{_ID}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?", _Handler.tree),
    ("POST", rf"/api/{_T}/{_ID}/preupload/(?P<rev>[^/]+)", _Handler.preupload),
    ("POST", rf"/api/{_T}/{_ID}/commit/(?P<rev>[^/]+)", _Handler.commit),
    ("POST", rf"/(?P<prefix>datasets/|spaces/)?{_ID}\.git/info/lfs/objects/batch", _Handler.lfs_batch),
    ("PUT", r"/__lfs/(?P<oid>[0-9a-f]{64})", _Handler.lfs_put),
    ("POST", r"/__lfs/(?P<oid>[0-9a-f]{64})/verify", _Handler.lfs_verify),
    ("GET", rf"/(?P<prefix>datasets/|spaces/)?{_ID}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", _Handler.resolve),
    ("HEAD", rf"/(?P<prefix>datasets/|spaces/)?{_ID}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", _Handler.resolve),
]
