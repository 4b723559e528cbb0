"""ORAS's Python SDK (PyPI `oras`) on a registry ragen-host uses: an
independent client of the OCI distribution protocol, for the
interoperability test in host/cli/tests/all/oci.rs.

    python oras_interop.py pull HOST:PORT/REPO:TAG OUTDIR
        pulls with oras-py; prints JSON: the file's sha256, the manifest,
        its digest and the config blob.
    python oras_interop.py push HOST:PORT/REPO:TAG FILE.wasm
        pushes FILE as one `application/wasm` layer, oras-py's way (its own
        config and annotations).

Plain HTTP: the test registry listens on 127.0.0.1 only.
"""

import hashlib
import json
import os
import sys

import oras.provider


def registry(target):
    return oras.provider.Registry(hostname=target.split("/")[0], insecure=True)


def pull(target, outdir):
    reg = registry(target)
    files = reg.pull(target=target, outdir=outdir)
    if len(files) != 1:
        raise SystemExit(f"expected one file, oras-py pulled {files}")
    manifest = reg.get_manifest(target)
    container = reg.get_container(target)
    response = reg.get_blob(container, manifest["config"]["digest"])
    response.raise_for_status()
    body = json.dumps(manifest, separators=(",", ":"))
    with open(files[0], "rb") as f:
        data = f.read()
    return {
        "file": os.path.basename(files[0]),
        "sha256": hashlib.sha256(data).hexdigest(),
        "manifest": manifest,
        "manifest_digest": digest_of(reg, target, body),
        "config": response.json(),
    }


def digest_of(reg, target, _body):
    """The manifest digest the registry reports (Docker-Content-Digest)."""
    container = reg.get_container(target)
    url = f"{reg.prefix}://{container.manifest_url()}"
    headers = {"Accept": "application/vnd.oci.image.manifest.v1+json"}
    response = reg.do_request(url, "HEAD", headers=headers)
    response.raise_for_status()
    return response.headers["Docker-Content-Digest"]


def push(target, path):
    reg = registry(target)
    os.chdir(os.path.dirname(os.path.abspath(path)))
    response = reg.push(target=target, files=[f"{os.path.basename(path)}:application/wasm"], disable_path_validation=True)
    response.raise_for_status()
    return {"pushed": target}


if __name__ == "__main__":
    verb, target, path = sys.argv[1:4]
    result = pull(target, path) if verb == "pull" else push(target, path)
    print(json.dumps(result))
