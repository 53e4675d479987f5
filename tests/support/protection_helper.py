"""Independent implementation of the documented payload-protection formats
(docs/payload-protection.md), for tests/payload_protection.rs. Reads one JSON request on
stdin, writes one JSON answer on stdout. Uses only the Python standard library and
`cryptography` (AESGCM, HKDF, Ed25519): no code shared with svc.

Requests:
  {"op": "sign", "items": [{"alg", "key_b64" (hmac secret or ed25519 seed), "message_id",
                            "payload_b64", "subject"}]}
      -> {"signatures": [<base64>...], "public_keys": [<base64 or null>...]}
  {"op": "open", "keys": {id: b64}, "digest_key_id": id, "records": [record...],
   "raw_payloads": {"<stream_sequence>": b64}}
      -> {"results": [{"seq", "key_id", "plaintext", "swap_refused", "digest_ok"}]}
  {"op": "s3_objects", "endpoint", "key_id", "secret", "bucket"}
      -> {"objects": [{"key", "body"}]}   (boto3, signed requests against moto)
"""
import base64
import hashlib
import hmac
import json
import sys

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF


def signed_bytes(message_id, payload, subject):
    doc = {
        "message_id": message_id,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        "subject": subject,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(items):
    sigs, pubs = [], []
    for it in items:
        key = base64.b64decode(it["key_b64"])
        data = signed_bytes(it["message_id"], base64.b64decode(it["payload_b64"]), it["subject"])
        if it["alg"] == "hmac-sha256":
            sigs.append(base64.b64encode(hmac.new(key, data, hashlib.sha256).digest()).decode())
            pubs.append(None)
        else:
            sk = Ed25519PrivateKey.from_private_bytes(key)
            sigs.append(base64.b64encode(sk.sign(data)).decode())
            raw = sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
            pubs.append(base64.b64encode(raw).decode())
    return {"signatures": sigs, "public_keys": pubs}


def aad(stream, seq, subject):
    return f"{stream}\n{seq}\n{subject}".encode("utf-8")


def open_records(req):
    keys = {k: base64.b64decode(v) for k, v in req["keys"].items()}
    digest_key = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=None, info=b"svc.payload_info.sha256.v1"
    ).derive(keys[req["digest_key_id"]])
    out = []
    for rec in req["records"]:
        p = rec["payload"]
        assert set(p) == {"schema", "alg", "key_id", "nonce", "ciphertext"}, p
        assert p["schema"] == "svc.encrypted_payload.v1" and p["alg"] == "A256GCM", p
        aead = AESGCM(keys[p["key_id"]])
        nonce = base64.b64decode(p["nonce"])
        assert len(nonce) == 12
        ct = base64.b64decode(p["ciphertext"])
        seq = rec["stream_sequence"]
        plain = aead.decrypt(nonce, ct, aad(rec["stream"], seq, rec["subject"]))
        try:
            aead.decrypt(nonce, ct, aad(rec["stream"], seq + 1, rec["subject"]))
            swap_refused = False
        except InvalidTag:
            swap_refused = True
        raw = base64.b64decode(req["raw_payloads"][str(seq)])
        digest = hmac.new(digest_key, raw, hashlib.sha256).hexdigest()
        out.append({
            "seq": seq,
            "key_id": p["key_id"],
            "plaintext": plain.decode("utf-8"),
            "swap_refused": swap_refused,
            # A relational row (row_to_json) holds it in the payload_sha256 column.
            "digest_ok": digest == (rec["payload_info"]["sha256"] if "payload_info" in rec
                                    else rec["payload_sha256"]),
        })
    return {"results": out}


def s3_objects(req):
    import boto3

    s3 = boto3.client(
        "s3", endpoint_url=req["endpoint"], region_name="us-east-1",
        aws_access_key_id=req["key_id"], aws_secret_access_key=req["secret"])
    out = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=req["bucket"]):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=req["bucket"], Key=obj["Key"])["Body"].read()
            out.append({"key": obj["Key"], "body": body.decode("utf-8")})
    return {"objects": out}


def main():
    req = json.load(sys.stdin)
    if req["op"] == "sign":
        ans = sign(req["items"])
    elif req["op"] == "open":
        ans = open_records(req)
    elif req["op"] == "s3_objects":
        ans = s3_objects(req)
    else:
        raise SystemExit("unknown op")
    json.dump(ans, sys.stdout)


if __name__ == "__main__":
    main()
