#!/usr/bin/env python3
"""Packs a directory into an OCI image archive that `ctr images import` takes.

usage: oci-image.py ROOTFS OUT.tar NAME [--entrypoint JSON] [--cmd JSON] [--env K=V]...
                    [--user UID[:GID]] [--workdir DIR]

No registry is reachable from the lab and no image builder runs here, so images are plain
directories packed as one uncompressed layer: the layer's digest is then also its diff ID, and
nothing is compressed only to be unpacked again a moment later. Files keep their numeric owners
and modes; timestamps are zeroed so that the same tree gives the same digest.
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile


def layer_of(rootfs: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, files in os.walk(rootfs):
            dirs.sort()
            for name in sorted(dirs) + sorted(files):
                path = os.path.join(top, name)
                info = tar.gettarinfo(path, arcname=os.path.relpath(path, rootfs))
                info.mtime = 0
                info.uname = info.gname = ""
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
    return buf.getvalue()


def blob(tar: tarfile.TarFile, data: bytes, media_type: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo("blobs/sha256/" + digest.split(":", 1)[1])
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rootfs")
    ap.add_argument("out")
    ap.add_argument("name", help="full image name, e.g. pgwake.local/busybox:1")
    ap.add_argument("--entrypoint", type=json.loads)
    ap.add_argument("--cmd", type=json.loads)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--user")
    ap.add_argument("--workdir")
    args = ap.parse_args()

    layer = layer_of(args.rootfs)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    if any(e.startswith("PATH=") for e in args.env):
        env = []
    env += args.env
    config = {"Env": env}
    for key, value in (
        ("Entrypoint", args.entrypoint),
        ("Cmd", args.cmd),
        ("User", args.user),
        ("WorkingDir", args.workdir),
    ):
        if value is not None:
            config[key] = value
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }

    tmp = args.out + ".partial"
    with tarfile.open(tmp, mode="w") as tar:
        layer_desc = blob(tar, layer, "application/vnd.oci.image.layer.v1.tar")
        config_desc = blob(
            tar,
            json.dumps(image_config, sort_keys=True).encode(),
            "application/vnd.oci.image.config.v1+json",
        )
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = blob(
            tar,
            json.dumps(manifest, sort_keys=True).encode(),
            "application/vnd.oci.image.manifest.v1+json",
        )
        manifest_desc["annotations"] = {
            "io.containerd.image.name": args.name,
            "org.opencontainers.image.ref.name": args.name.rsplit(":", 1)[-1],
        }
        index = {"schemaVersion": 2, "manifests": [manifest_desc]}
        add_file(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        add_file(tar, "index.json", json.dumps(index, sort_keys=True).encode())
    os.replace(tmp, args.out)
    print(f"{args.name} {manifest_desc['digest']} {len(layer)} bytes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
