"""Test helper around moto (the S3-compatible server the object-store tests run against).

  moto_helper.py serve PORT [CERT KEY] run moto on 127.0.0.1:PORT with signature checking enforced
                                  after three unauthenticated IAM calls; exits when the parent
                                  (the test process) is gone, so no server outlives a test run
  moto_helper.py setup ENDPOINT        make those three IAM calls; print {"key_id", "secret"}
  moto_helper.py bucket ENDPOINT KEY SECRET NAME true|false
                                  create a bucket (versioned when true)
  moto_helper.py versions ENDPOINT KEY SECRET BUCKET
                                  print every object version of the bucket as JSON
  moto_helper.py role ENDPOINT KEY SECRET NAME
                                  create role NAME (assumable by anyone, allowed everything)
  moto_helper.py assume ENDPOINT KEY SECRET N
                                  N sets of temporary credentials from moto's STS AssumeRole
                                  of role svc-issued (signed with KEY/SECRET), as a JSON list of
                                  {"key_id", "secret", "token"}
"""
import json
import os
import sys
import time


class AtomicConditionalPut:
    """WSGI middleware: makes a conditional PUT (If-None-Match) atomic per key.

    moto 5.2 checks If-None-Match and then stores the object in separate steps
    (s3/responses.py), so two racing conditional writers of one key can both get 200. S3
    itself guarantees that exactly one wins; striped per-key locks restore that guarantee
    without serialising unrelated keys.
    """

    STRIPES = 256

    def __init__(self, app):
        import threading

        self.app = app
        self.locks = [threading.Lock() for _ in range(self.STRIPES)]

    def __call__(self, environ, start_response):
        if environ.get("REQUEST_METHOD") == "PUT" and environ.get("HTTP_IF_NONE_MATCH"):
            key = (environ.get("HTTP_HOST", ""), environ.get("PATH_INFO", ""))
            with self.locks[hash(key) % self.STRIPES]:
                return list(self.app(environ, start_response))
        return self.app(environ, start_response)


def serve(port, cert=None, key=None):
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"
    parent = os.getppid()
    import threading

    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = AtomicConditionalPut(DomainDispatcherApplication(create_backend_app))
    server = None
    kind = "werkzeug"
    if cert:
        server = make_server("127.0.0.1", port, app, threaded=True, ssl_context=(cert, key))
        threading.Thread(target=server.serve_forever, daemon=True).start()
    else:
        # waitress keeps HTTP/1.1 connections alive (werkzeug's server closes every one), so
        # the client's connection reuse is exercised as it would be against a real service.
        try:
            import waitress
        except ImportError:
            waitress = None
        if waitress:
            kind = "waitress"
            # create_server binds now: a taken port raises here, before "ready" is printed,
            # and the test harness retries on another port.
            listener = waitress.create_server(
                app, host="127.0.0.1", port=port, threads=32,
                connection_limit=1000, channel_timeout=30)
            threading.Thread(target=listener.run, daemon=True).start()
        else:
            server = make_server("127.0.0.1", port, app, threaded=True)
            threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready " + kind, flush=True)
    while os.getppid() == parent:
        time.sleep(0.2)
    if server:
        server.shutdown()


def client(service, endpoint, key="testing", secret="testing"):
    import boto3

    return boto3.client(
        service,
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
    )


def setup(endpoint):
    iam = client("iam", endpoint)
    iam.create_user(UserName="svc-test")
    key = iam.create_access_key(UserName="svc-test")["AccessKey"]
    policy = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
    }
    iam.put_user_policy(
        UserName="svc-test", PolicyName="all", PolicyDocument=json.dumps(policy)
    )
    print(json.dumps({"key_id": key["AccessKeyId"], "secret": key["SecretAccessKey"]}))


def bucket(endpoint, key, secret, name, versioned):
    s3 = client("s3", endpoint, key, secret)
    # "lock": Object Lock enabled at creation (which makes the bucket versioned).
    s3.create_bucket(Bucket=name, ObjectLockEnabledForBucket=(versioned == "lock"))
    if versioned == "true":
        s3.put_bucket_versioning(
            Bucket=name, VersioningConfiguration={"Status": "Enabled"}
        )
    print("{}")


def versions(endpoint, key, secret, bucket):
    s3 = client("s3", endpoint, key, secret)
    out = []
    # One page: moto's signature check rejects boto3's follow-up requests (key-marker).
    page = s3.list_object_versions(Bucket=bucket, MaxKeys=1000000)
    assert not page.get("IsTruncated"), "listing truncated"
    for v in page.get("Versions", []):
        out.append({"key": v["Key"], "version_id": v["VersionId"], "size": v["Size"]})
    print(json.dumps(out))


def lock(endpoint, key, secret, bucket, name):
    """An object's retention, legal hold and encryption as the store reports them, and whether
    deleting its version is refused."""
    s3 = client("s3", endpoint, key, secret)
    h = s3.head_object(Bucket=bucket, Key=name)
    until = h.get("ObjectLockRetainUntilDate")
    out = {"mode": h.get("ObjectLockMode"),
           "retain_until": until.timestamp() if until else None,
           "legal_hold": h.get("ObjectLockLegalHoldStatus"),
           "sse": h.get("ServerSideEncryption"), "kms_key_id": h.get("SSEKMSKeyId")}
    try:
        s3.delete_object(Bucket=bucket, Key=name, VersionId=h["VersionId"])
        out["delete"] = "deleted"
    except Exception as e:  # noqa: BLE001 - the refusal is what is reported
        out["delete"] = "refused: " + type(e).__name__
    print(json.dumps(out))


def role(endpoint, key, secret, name):
    """A role anyone may assume, allowed everything (moto answers 500 to requests signed with
    credentials of a role it does not know)."""
    iam = client("iam", endpoint, key, secret)
    trust = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}
    try:
        iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))
    except iam.exceptions.EntityAlreadyExistsException:
        pass
    policy = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
    iam.put_role_policy(RoleName=name, PolicyName="all", PolicyDocument=json.dumps(policy))


def assume(endpoint, key, secret, n):
    role(endpoint, key, secret, "svc-issued")
    sts = client("sts", endpoint, key, secret)
    out = []
    for i in range(int(n)):
        c = sts.assume_role(
            RoleArn="arn:aws:iam::123456789012:role/svc-issued",
            RoleSessionName="svc-test-%d" % i,
        )["Credentials"]
        out.append(
            {"key_id": c["AccessKeyId"], "secret": c["SecretAccessKey"],
             "token": c["SessionToken"]}
        )
    print(json.dumps(out))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "serve":
        serve(int(sys.argv[2]), *sys.argv[3:5])
    elif cmd == "setup":
        setup(sys.argv[2])
    elif cmd == "bucket":
        bucket(*sys.argv[2:7])
    elif cmd == "versions":
        versions(*sys.argv[2:6])
    elif cmd == "lock":
        lock(*sys.argv[2:7])
    elif cmd == "assume":
        assume(*sys.argv[2:6])
    elif cmd == "role":
        role(*sys.argv[2:6])
        print("{}")
    else:
        sys.exit("unknown command " + cmd)
