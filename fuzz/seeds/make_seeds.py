#!/usr/bin/env python3
"""Writes the committed seed corpora (fuzz/corpus/<target>/seed-*): small, realistic inputs
per target, taken from the docs and the unit tests. Re-run after changing a seed here:
`python3 fuzz/seeds/make_seeds.py`. The grown corpus is never committed (.gitignore)."""
import base64, hashlib, os, struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "corpus")

def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)

# security_labels: selector byte (bits 0-1 max_bytes 64/512/8192/262144, bit 2 vocabularies).
for i, h in enumerate([
    '{"profile":"svc.security-label.v1","priority":"high","classification":"secret","labels":["eu","pii"],"releasability":["nato"],"handling_caveats":["noforn"],"owner":"team-a","originator":"orders-api","policy_id":"p-7","retention_category":"long"}',
    '{"classification":"restricted","labels":["eu","pii"],"owner":"team-a","priority":null,"profile":"svc.security-label.v1","releasability":["X","Y"]}',
    '{"extensions": {"site": "x", "nested": {"a": [1, {"b": null}]}, "o": {"p": {"q": {}}}}}',
    '{"owner": 1, "releasability": [2]}',
    '{"classification": "SECRET", "labels": []}',
    '{"a":1,"a":2}',
    '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]',
    '{"owner":"a\\u0000b","extensions":{"password":"x"}}',
]):
    put("security_labels", f"{i}", bytes([[2, 6, 1, 4, 5, 2, 2, 6][i]]) + h.encode())

# message_metadata: selector (bits 0-1 separator , ; | space; 2-3 max_labels 1/4/32/256;
# bit 4 use_default), then `name:value` lines; p/c/l stand for the configured header names.
for i, (sel, text) in enumerate([
    (8, "p: High\nc:  Restricted   EU \nl:pii, eu,PII,gdpr"),
    (9, "Svc-Priority:low\nSvc-Labels:a;b;c"),
    (0, "p:HIGH\np:low"),
    (16, "c:not ok!\nl:" + ",".join(f"l{i}" for i in range(40))),
    (14, "l:a  b| c |d||e\nX-Other: v"),
]):
    put("message_metadata", f"{i}", bytes([sel]) + text.encode())

# runtime_config
base_nats = '"nats": {"url": "nats://127.0.0.1:4222", "stream": "ORDERS", "consumer": "svc", "subject": "orders.>"}'
configs = [
    '{\n  ' + base_nats + ',\n  "sink": {"type": "file", "directory": "/var/lib/svc/out"}\n}',
    '{' + base_nats + ', "sink": {"type": "relational_db", "dsn": "postgresql://svc_writer@db.internal:5432/events", "password_env": "SVC_DB_PASSWORD", "tls_mode": "verify_full", "tls_ca_file": "/etc/svc/db-ca.pem", "table": "audit.events", "routes": [{"subject": "orders.eu.>", "table": "audit.eu_orders"}, {"subject": "orders.>", "table": "audit.orders"}]}}',
    '{' + base_nats + ', "sink": {"type": "object_store", "bucket": "event-archive", "region": "eu-west-1"}, "delivery": {"batch_size": 100, "max_in_flight_batches": 4}}',
    '{' + base_nats + ', "sink": {"type": "fanout", "sinks": {"archive": {"type": "file", "directory": "/tmp/a"}, "mirror": {"type": "file", "directory": "/tmp/b"}}, "routing": {"enabled": true, "target_sink_types": {"archive": "file", "mirror": "file"}, "routes": [{"name": "orders", "match": {"subject": "orders.>"}, "targets": ["archive", {"sink": "mirror", "required": false}]}]}}}',
    '{' + base_nats + ', "sink": {"type": "file", "directory": "/tmp/out"}, "message_metadata": {"default_priority": "normal", "rules": [{"subject": "orders.eu.>", "classification": "restricted", "labels": ["eu"]}]}, "security_labels": {"enabled": true, "max_bytes": 2048, "allowed_classifications": ["unclassified", "restricted"], "default": {"classification": "unclassified"}, "rules": [{"subject": "public.>", "profile": null}]}, "dead_letter": {"enabled": true, "subject": "dlq.orders"}, "metrics": {"snapshot_path": "/run/svc/metrics.json"}}',
    '{"nats": {"url": "http://x", "stream": "a b", "subject": "a..b", "bogus": 1}, "sink": {"type": "nope"}, "\\u0001key": 1}',
    '{"nats": {"url": "nats://user:pw@host:4222"}}',
]
for i, c in enumerate(configs):
    put("runtime_config", f"{i}", c)

# observe_policy
S = '"schema": "svc.observability.policy.v1"'
policies = [
    '{' + S + '}',
    '{' + S + ', "enabled": true, "namespace": "svc", "allowed_metric_patterns": ["messages_*"], "denied_metrics": ["messages_dlq_total"], "include_observations": true, "scrape": {"enabled": true, "stale_after_seconds": 120, "http_endpoint": {"enabled": true, "bind": "127.0.0.1", "port": 9464, "path": "/metrics"}}}',
    '{' + S + ', "enabled": true, "subject_metrics": {"enabled": true, "max_subject_families": 20, "rules": [{"subject": "orders.>", "label": "orders"}, {"subject": "orders.internal.>", "action": "deny"}]}}',
    '{' + S + ', "enabled": true, "otlp": {"enabled": true, "endpoint": "https://otel.example.com/v1/metrics", "headers_env": {"Authorization": "OTLP_AUTH"}}, "siem_hec": {"enabled": true, "endpoint": "https://hec.example.com:8088/services/collector/event", "token_env": "HEC_TOKEN", "index": "svc_metrics"}}',
    '{' + S + ', "enabled": true, "statsd": {"enabled": true, "host": "127.0.0.1", "port": 8125}, "agent_statsd": {"enabled": true, "tags": {"env": "prod"}}, "syslog": {"enabled": true, "transport": "udp"}}',
    '{' + S + ', "enabled": true, "broker_server_monitoring": {"enabled": true, "base_url": "http://127.0.0.1:8222", "allowed_endpoints": ["/varz", "/jsz"], "allowed_fields": ["connections", "jetstream.stats.memory"]}, "cloud_a_monitoring": {"enabled": true, "compartment_id_env": "OCI_COMPARTMENT", "region": "eu-frankfurt-1"}, "cloud_b_monitoring": {"enabled": true, "region": "eu-west-1"}, "cloud_c_monitoring": {"enabled": true, "location": "westeurope"}}',
    '{"schema": "v2", "bogus": 1, "namespace": "svc-metrics"}',
]
for i, p in enumerate(policies):
    put("observe_policy", f"{i}", p)

# metrics_snapshot
snap = '''{
  "schema": "svc.metrics.snapshot.v1",
  "namespace": "svc",
  "generated_at_epoch_seconds": 1718000000.25,
  "started_at_epoch_seconds": 1717990000.0,
  "counters": {"messages_acked_total": 1200, "messages_fetched_total": 1210},
  "gauges": {"last_sink_success_epoch_seconds": 1717999999.0},
  "summaries": {
    "sink_batch_write_seconds": {"count": 40, "sum": 1.9, "min": 0.01, "max": 0.2, "last": 0.04}
  },
  "labeled_metrics": [
    {"kind": "counter", "name": "messages_written_total", "value": 700,
     "labels": {"subject_family": "orders_eu"}}
  ],
  "subject_families": [
    {"label": "orders_eu", "subject": "orders.eu.>"}
  ]
}'''
put("metrics_snapshot", "0", snap)
put("metrics_snapshot", "1", '{"schema":"svc.metrics.snapshot.v1","namespace":"svc","generated_at_epoch_seconds":0,"started_at_epoch_seconds":0,"counters":{},"gauges":{},"summaries":{}}')
put("metrics_snapshot", "2", '{"schema":"other","namespace":"svc","generated_at_epoch_seconds":1e300,"started_at_epoch_seconds":-1,"counters":{"x\\n y_total":18446744073709551615},"gauges":{"g":-0.0},"summaries":{},"extra":1}')

# http_head
for i, h in enumerate([
    b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9464\r\nUser-Agent: Prometheus/2.53.0\r\nAccept: application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.1\r\nAccept-Encoding: gzip\r\nX-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n",
    b"GET /metrics?x=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    b"GET /m HTTP/1.1\r\nHost: a\nX: b\r\nHost: c\r\n folded\r\n\r\nGET /m HTTP/1.1\r\n\r\n",
]):
    put("http_request_head", f"{i}", h)

# pg_backend: selector (even: the codec alone; odd: a conversation, bit 1 set = scram off,
# bits 2-4 = md5, password, none allowed), then the server's whole side of a conversation.
PG_SELECTORS = [b"\x00", b"\x01", b"\x1d"]
def msg(tag, body):
    return tag + struct.pack(">i", len(body) + 4) + body
def cstr(s):
    return s.encode() + b"\0"
R = lambda code, rest=b"": msg(b"R", struct.pack(">i", code) + rest)
params = msg(b"S", cstr("server_version") + cstr("16.3")) + msg(b"S", cstr("client_encoding") + cstr("UTF8"))
ready = msg(b"Z", b"I")
keydata = msg(b"K", struct.pack(">ii", 4242, 77))
row_desc = msg(b"T", struct.pack(">h", 1) + cstr("?column?") + struct.pack(">ihihih", 0, 0, 23, 4, -1, 0))
data_row = msg(b"D", struct.pack(">h", 2) + struct.pack(">i", 1) + b"1" + struct.pack(">i", -1))
complete = msg(b"C", cstr("SELECT 1"))
err = msg(b"E", cstr("SERROR") + cstr("VERROR") + cstr("C42P01") + cstr("Mrelation \"audit.events\" does not exist") + cstr("Ddetail with a row value") + b"\0")
fatal = msg(b"E", cstr("SFATAL") + cstr("VFATAL") + cstr("C28P01") + cstr("Mpassword authentication failed for user \"svc\"") + b"\0")
notice = msg(b"N", cstr("SNOTICE") + cstr("C00000") + cstr("Mhello") + b"\0")
ext = msg(b"1", b"") + msg(b"2", b"") + data_row + complete + ready
for i, sel in enumerate(PG_SELECTORS):
    put("pg_backend", f"trust-{i}", sel + R(0) + params + keydata + ready + row_desc + data_row + complete + ready + ext)
for i, sel in enumerate(PG_SELECTORS):
    put("pg_backend", f"cleartext-{i}", sel + R(3) + R(0) + params + ready + notice + err + ready)
for i, sel in enumerate(PG_SELECTORS):
    put("pg_backend", f"md5-{i}", sel + R(5, b"\x01\x02\x03\x04") + R(0) + ready + msg(b"I", b"") + ready)
for i, sel in enumerate(PG_SELECTORS):
    put("pg_backend", f"sasl-{i}", sel + R(10, cstr("SCRAM-SHA-256") + b"\0") + R(11, b"r=abc,s=c2FsdA==,i=4096") + R(12, b"v=AAAA") + R(0) + ready)
for i, sel in enumerate(PG_SELECTORS):
    put("pg_backend", f"skip-scram-{i}", sel + R(10, cstr("SCRAM-SHA-256-PLUS") + cstr("SCRAM-SHA-256") + b"\0") + ready + complete + ready)
for i, sel in enumerate(PG_SELECTORS):
    put("pg_backend", f"fatal-{i}", sel + fatal)
for i, sel in enumerate(PG_SELECTORS):
    put("pg_backend", f"no-auth-{i}", sel + params + ready + msg(b"D", struct.pack(">h", 3) + struct.pack(">i", 100) + b"x") + ready)
for i, sel in enumerate(PG_SELECTORS):
    put("pg_backend", f"copy-{i}", sel + R(0) + ready + msg(b"G", b"\0\0\0") + b"Z\x7f\xff\xff\xff")

# pg_backend, SCRAM parsers: selector 4 = server-first, 6 = server-final and SASLprep.
put("pg_backend", "scram-first", b"\x04" + b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
put("pg_backend", "scram-final", b"\x06" + b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
put("pg_backend", "scram-error", b"\x06" + "e=invalid-proof\u00a0\u2168".encode())

# http_answer: status 100 + 2 * first byte; Retry-After NUL body.
put("http_answer", "0", b"\xca" + b"2\0service unavailable")
put("http_answer", "1", b"\xca" + b"Wed, 21 Oct 2015 07:28:00 GMT\0")
put("http_answer", "2", b"\x96" + b"\0refused: bad record \x1b[31m tok-fuzz-5a1d0c3e9b\n")
put("http_answer", "3", b"\x64" + b"\0<html>moved</html>")
put("http_answer", "4", b"\xa4" + b"99999999999999999999999\0slow down")

# s3_error: selector even = raw body, odd = code NUL message (harness builds the document).
put("s3_error", "0", b"\x00" + b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message><BucketName>event-archive</BucketName><RequestId>4442587FB7D0A2F9</RequestId></Error>')
put("s3_error", "1", b"\x02" + b"<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not match &amp; &lt;x&gt;</Message></Error>")
put("s3_error", "2", b"\x01" + b"EntityTooLarge\0Your proposed upload exceeds the maximum allowed size")
put("s3_error", "3", b"\x08" + b"<html><body>502 Bad Gateway</body></html>")
put("s3_error", "4", b"\x03" + "SlowDown\x1b[31m\0Reduce your request rate.\nforged line \u202e".encode())

# cloud_answers: selector % 6: 0 cloud_a, 1 siem_hec, 2 token_of, 3 federation_failure,
# 4 region_id, 5 jwt_expiry.
def b64u(b):
    return base64.urlsafe_b64encode(b).decode().rstrip("=")
jwt = b64u(b'{"alg":"RS256"}') + "." + b64u(b'{"exp":1900000000,"sub":"ocid1.instance.oc1..x"}') + ".c2ln"
old_jwt = b64u(b'{"alg":"RS256"}') + "." + b64u(b'{"exp":1000}') + ".c2ln"
put("cloud_answers", "0", b"\x00" + b'{"failedMetricsCount": 0, "failedMetrics": []}')
put("cloud_answers", "1", b"\x00" + b'{"failedMetricsCount": 2, "failedMetrics": [{"message": "Metric name invalid", "metricData": {"compartmentId": "ocid1.compartment.oc1..x"}}]}')
put("cloud_answers", "2", b"\x01" + b'{"text":"Success","code":0}')
put("cloud_answers", "3", b"\x01" + b'{"text":"Incorrect index","code":7}')
put("cloud_answers", "4", b"\x02" + ('{"token":"%s"}' % jwt).encode())
put("cloud_answers", "5", b"\x02" + ('{"token":"%s"}' % old_jwt).encode())
put("cloud_answers", "6", b"\x03" + b'{"code":"NotAuthenticated","message":"The required information to complete authentication was not provided."}')
put("cloud_answers", "7", b"\x04" + b"fra\n")
put("cloud_answers", "8", b"\x04" + b"eu-frankfurt-1")
put("cloud_answers", "9", b"\x05" + jwt.encode())

# oci_certificate: selector even = PEM text, odd = DER.
def der(tag, content):
    n = len(content)
    if n < 0x80:
        return bytes([tag, n]) + content
    ln = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([tag, 0x80 | len(ln)]) + ln + content
def atv(oid, value, tag=0x0c):
    return der(0x31, der(0x30, der(0x06, oid) + der(tag, value.encode())))
name = der(0x30, atv(b"\x55\x04\x03", "ocid1.instance.oc1.eu-frankfurt-1.abc") + atv(b"\x55\x04\x0b", "opc-certtype:instance") + atv(b"\x55\x04\x0b", "opc-tenant:ocid1.tenancy.oc1..aaaaaaaexample", 0x13))
tbs = der(0x30, der(0xa0, der(0x02, b"\x02")) + der(0x02, b"\x01\x23") + der(0x30, der(0x06, b"\x2a\x86\x48\x86\xf7\x0d\x01\x01\x0b") + b"\x05\x00") + der(0x30, atv(b"\x55\x04\x03", "PKISVC Identity Intermediate")) + der(0x30, der(0x17, b"240101000000Z") + der(0x17, b"250101000000Z")) + name + der(0x30, b""))
cert = der(0x30, tbs + der(0x30, der(0x06, b"\x2a\x86\x48\x86\xf7\x0d\x01\x01\x0b")) + der(0x03, b"\x00\x01\x02"))
pem = "-----BEGIN CERTIFICATE-----\n" + "\n".join(base64.b64encode(cert).decode()[i:i+64] for i in range(0, len(base64.b64encode(cert)), 64)) + "\n-----END CERTIFICATE-----\n"
put("oci_certificate", "0", b"\x00" + pem.encode())
put("oci_certificate", "1", b"\x01" + cert)
put("oci_certificate", "2", b"\x00" + b"-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\n")
put("oci_certificate", "3", b"\x01" + b"\x30\x84\xff\xff\xff\xff\x30")

# broker_monitoring: selector (bits 0-1 size limit 16/256/4096/1MiB, 2-3 endpoint, 4-5 help/type).
put("broker_monitoring", "0", b"\x3e" + b'{"server_id":"NDXZ","version":"2.10.18","connections":3,"mem":12345678,"cpu":1.5,"in_msgs":1200,"slow_consumers":0}')
put("broker_monitoring", "1", b"\x37" + b'{"server_id":"NDXZ","memory":0,"storage":2048,"config":{"max_memory":1073741824},"jetstream":{"stats":{"memory":0,"storage":2048},"config":{"max_memory":1e400}}}')
put("broker_monitoring", "2", b"\x03" + b'{"a":{"b":{"c":{"d":-1.5e-7}}},"connections":"3\\n# HELP forged"}')

# aws_credentials: selector even = credentials file, odd = config file; profiles default, fuzz.
put("aws_credentials", "0", b"\x00" + b"[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n\n[fuzz]\naws_access_key_id=AKIAFUZZ\naws_secret_access_key=c2VjcmV0\naws_session_token = FwoGZXIvYXdzEXAMPLE\n")
put("aws_credentials", "1", b"\x01" + b"[default]\nregion = eu-west-1\n\n[profile fuzz]\nrole_arn = arn:aws:iam::123456789012:role/x\nsource_profile = default\n")
put("aws_credentials", "2", b"\x00" + b"# comment\n; other\n[ default ]\naws_secret_access_key = only-the-secret\n[fuzz]\naws_access_key_id = only-the-id\n")
put("aws_credentials", "3", b"\x01" + b"[default]\r\naws_access_key_id=A\r\naws_secret_access_key=B\r\n[profile   fuzz]\r\ncredential_process = /bin/secret-helper --token=XYZ\r\n")

# aws_answers: selector % 5: 0 STS AssumeRole XML, 1 STS error XML, 2 metadata JSON,
# 3 credential_process JSON, 4 command line.
put("aws_answers", "0", b"\x00" + b'<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><AssumeRoleResult><Credentials><AccessKeyId>ASIAIOSFODNN7EXAMPLE</AccessKeyId><SecretAccessKey>wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY</SecretAccessKey><SessionToken>IQoJb3JpZ2luX2VjEXAMPLETOKEN</SessionToken><Expiration>2026-11-23T20:00:00Z</Expiration></Credentials><AssumedRoleUser><Arn>arn:aws:sts::123456789012:assumed-role/demo/svc</Arn></AssumedRoleUser></AssumeRoleResult></AssumeRoleResponse>')
put("aws_answers", "1", b"\x01" + b'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>User: arn:aws:iam::123456789012:user/x is not authorized to perform: sts:AssumeRole</Message></Error><RequestId>c6104cbe</RequestId></ErrorResponse>')
put("aws_answers", "2", b"\x02" + b'{"Code":"Success","LastUpdated":"2026-11-23T18:00:00Z","Type":"AWS-HMAC","AccessKeyId":"ASIAIOSFODNN7EXAMPLE","SecretAccessKey":"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY","Token":"IQoJb3JpZ2luX2VjEXAMPLETOKEN","Expiration":"2026-11-23T20:00:00Z"}')
put("aws_answers", "3", b"\x02" + b'{"Code":"AssumeRoleUnauthorizedAccess","Message":"EC2 cannot assume the role\\nforged"}')
put("aws_answers", "4", b"\x03" + b'{"Version":1,"AccessKeyId":"AKIAIOSFODNN7EXAMPLE","SecretAccessKey":"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY","SessionToken":"tok","Expiration":"2026-11-23T20:00:00+00:00"}')
put("aws_answers", "5", b"\x04" + b"/usr/local/bin/aws-vault exec 'my profile' --json \"a \\\"b\\\" c\" x\\ y")

# ack_subject
for i, s in enumerate([
    "$JS.ACK.ORDERS.svc.1.1041.17.1718000000123456789.0",
    "$JS.ACK.hub.ACCHASH.ORDERS.svc.2.1041.17.1718000000123456789.5.rnd",
    "$JS.ACK.ORDERS.svc.1.1041.17.-1.0",
    "$JS.ACK..svc.1.2.3.4.5",
    "$JS.ACK.ORDERS.svc.+1.18446744073709551615.0.170141183460469231731687303715884105727.0",
]):
    put("ack_subject", f"{i}", s)

# payload_record: selector even = a record file's text (one object, an array, JSON lines);
# odd = the target seals a record (stream, subject, sequence bytes, each length-prefixed,
# then the payload) and alters it per bits 1-2 (none, sequence, subject, stream), bit 3 pretty.
ENC = '{"schema":"svc.encrypted_payload.v1","alg":"A256GCM","key_id":"k1","nonce":"AAECAwQFBgcICQoL","ciphertext":"q83vEjRWeJASNFZ4kBI0Vg=="}'
CUSTODY = '{"schema":"svc.custody.v1","alg":"hmac-sha256","runner_id":"runner-a","received_at":"2023-11-14T22:13:21Z","sealed_at":"2023-11-14T22:13:21.5Z","payload_digest":"' + "ab" * 32 + '","record_digest":"' + "cd" * 32 + '"}'
REC = ('{"stream":"ORDERS","stream_sequence":7,"consumer":"svc","consumer_sequence":3,"subject":"orders.created","message_id":"m-7","priority":"normal","classification":"","labels":"","labels_list":[],"security_labels":null,'
       '"metadata":{"schema":"svc.event_metadata.v1","received_at":"2023-11-14T22:13:21Z","published_at":"2023-11-14T22:13:20Z","event_time":null,"delivery_count":1,"headers":{},"security_labels":null},'
       '"payload_info":{"original_format":"json","wrapped":false,"sha256":"' + "00" * 32 + '","size_bytes":12},'
       '"payload":' + ENC + ',"custody":' + CUSTODY + '}')
put("payload_record", "0", b"\x00" + REC.encode())
put("payload_record", "1", b"\x00" + ("[" + REC + "," + REC.replace('"stream_sequence":7', '"stream_sequence":8') + "]").encode())
put("payload_record", "2", b"\x00" + (REC + "\n\n" + REC.replace('"key_id":"k1"', '"key_id":"k2\\u001b[31m"') + "\n").encode())
put("payload_record", "3", b"\x00" + b'{"stream":"ORDERS","stream_sequence":7,"subject":"orders.created","message_id":null,"metadata_json":{"received_at":"2023-11-14T22:13:21Z"},"payload_sha256":"00","payload_original_format":"json","payload_wrapped":false,"payload_size_bytes":1,"security_labels_json":null,"custody_json":' + CUSTODY.encode() + b',"payload":' + ENC.encode() + b'}')
put("payload_record", "4", b"\x00" + b'{"stream":"S\\u202e","stream_sequence":"7\\u007f","subject":1,"payload":{"schema":"svc.encrypted_payload.v1","alg":"A256GCM","key_id":"k1","nonce":"!!","ciphertext":"AA=="}}\n{"secret": oops\n')
def sealed(sel, stream, subject, seq, payload):
    seqb = seq.to_bytes(8, "big").lstrip(b"\x00")
    return bytes([sel, len(stream)]) + stream + bytes([len(subject)]) + subject + bytes([len(seqb)]) + seqb + payload
put("payload_record", "5", sealed(1, b"ORDERS", b"orders.created", 7, b'{"amount": 1.50, "n": 1e2, "items": [1, 2]}'))
put("payload_record", "6", sealed(3, b"ORDERS", b"orders.eu.created", 1 << 40, b"plain text \x00\xff"))
put("payload_record", "7", sealed(5, b"S\n", b'orders."odd"', 0, b'{"z":{"y":[null,true,-0.0,1e300]}}'))
put("payload_record", "8", sealed(15, b"", b"", 18446744073709551615, b""))

# authenticity_headers: selector (bits 0-3 message id / alg / key id / signature headers
# present, 4 one repeated, 5 required by default, 6-7 signer: input, HMAC, Ed25519, both),
# then subject, message id, alg, key id, signature (length-prefixed), then the payload.
def auth(sel, subject, mid, alg, kid, sig, payload):
    out = bytes([sel])
    for f in (subject, mid, alg, kid, sig):
        out += bytes([len(f)]) + f
    return out + payload
put("authenticity_headers", "0", auth(0x0f, b"orders.created", b"order-1", b"hmac-sha256", b"h1", base64.b64encode(bytes(32)), b'{"a":1}'))
put("authenticity_headers", "1", auth(0x0e, b"signed.x", b"", b"ed25519", b"ed1", base64.b64encode(bytes(64)), b"payload"))
put("authenticity_headers", "2", auth(0x41, b"orders.created", b"order-\"1\"\n", b"", b"", b"", b'{"a":1}'))
put("authenticity_headers", "3", auth(0x81, b"signed.orders", b"m-1", b"", b"", b"", b"\x00\xff bytes"))
put("authenticity_headers", "4", auth(0x40, b"signed.a", b"", b"", b"", b"", b""))
put("authenticity_headers", "5", auth(0xc0, b"orders.x", b"", b"", b"", b" =", b"x"))
put("authenticity_headers", "6", auth(0x1e, b"orders.created", b"", b"HMAC-SHA256", b"unknown", b"not base64!", b"x"))
put("authenticity_headers", "7", auth(0x20, b"orders.created", b"", b"", b"", b"", b"unsigned"))
put("authenticity_headers", "8", auth(0x0c, b"orders.\xc3\x28", b"", b"", b"ed1", base64.b64encode(bytes(33)), b""))

# consumer_info: selector bits 0-1 the expected filter (orders.>, "", a.*.b, payments.eu.>).
put("consumer_info", "0", b"\x00" + b'{"type":"io.nats.jetstream.api.v1.consumer_info_response","stream_name":"ORDERS","name":"svc","config":{"durable_name":"svc","filter_subject":"orders.>"}}')
put("consumer_info", "1", b"\x03" + b'{"type":"io.nats.jetstream.api.v1.consumer_info_response","stream_name":"ORDERS","name":"svc","config":{"durable_name":"svc","filter_subject":"orders.>"}}')
put("consumer_info", "2", b"\x00" + b'{"type":"io.nats.jetstream.api.v1.consumer_info_response","error":{"code":404,"err_code":10014,"description":"consumer not found"}}')
put("consumer_info", "3", b"\x00" + b'{"error":{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable\\u001b[2J"}}')
put("consumer_info", "4", b"\x01" + b'{"config":{"filter_subjects":["a","b"]}}')
put("consumer_info", "5", b"\x00" + b'{"config":{"filter_subject":"x\\u202e\\u0085y"},"error":null}')
put("consumer_info", "6", b"\x00" + b"503 No Responders")
put("consumer_info", "7", b"\x02" + b"409 Consumer Deleted")
put("payload_record", "9", b"\x00" + b'{"stream":"S\\u202e","stream_sequence":{"n":"7\\u202e"},"subject":"s","payload":null}')

# canonical_json: documents as stores hold them (numbers in every form, escapes, nesting).
for i, doc in enumerate([
    '{"amount": 1.50, "n": 1e2, "big": 18446744073709551616, "tiny": 5e-324, "neg": -0.0}',
    '[0.1000000000000000055511151231257827, 1e-7, 1.5e300, 1E+2, 12345678901234567.5]',
    '{"s": "tab\\there \\"q\\" \\u00e9 \\ud83d\\ude00", "o": {"b": [], "a": {}}, "t": true, "z": null}',
    '{"amount":1,"amount":2}',
    '{"a":1,"\\u0061":2}',
    '[1e999999999, -1e-999999999]',
    '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]',
    '{"schema":"svc.envelope.v1","stream":"ORDERS","stream_sequence":7,"payload":{"order":42},"custody":{"alg":"sha256"}}',
]):
    put("canonical_json", f"{i}", doc)

# nats_protocol: selector (bits 0-5 read size - 1, bit 6 publisher mode). Mode 0: a server's
# stream; mode 1: a subject length byte, the subject, then a header block's lines.
put("nats_protocol", "0", b'\x07' + b'INFO {"server_id":"x","host":"h","port":4222,"version":"2.9.10","max_payload":1048576,"proto":1,"client_id":1,"go":"go"}\r\nPING\r\nMSG a.b 1 _INBOX.x 2\r\n{}\r\nHMSG _INBOX.x 1 20 20\r\nNATS/1.0 408 Timeout\r\n\r\n\r\n')
put("nats_protocol", "1", b'\x40' + bytes([8]) + b'orders.a' + b'Nats-Msg-Id: m-1\r\nX: y')
put("nats_protocol", "2", b'\x41' + bytes([9]) + b'orders.\xff\xfe' + b'X-Note: Nats-Msg-Id\r\nNats-Msg-Id: real')
put("nats_protocol", "3", b'\x7f' + bytes([14]) + 'orders.caf\u00e9\u00a0m'.encode() + b'no colon\r\n folded')

# spool_segment: a segment's bytes after its 8-byte header; frames are
# mark F5 53 52 0A | length u32 LE | CRC-32 (IEEE, of the length bytes and the body) | body,
# the body a flag byte, the append time (u64 LE ms) and the file sink's record JSON.
import json, zlib

def spool_frame(body):
    length = struct.pack("<I", len(body))
    return b"\xf5SR\n" + length + struct.pack("<I", zlib.crc32(length + body)) + body

def spool_body(seq, payload, flags=0):
    record = {
        "schema": "svc.file.message.v1", "subject": "orders.created", "stream": "ORDERS",
        "stream_sequence": seq, "consumer": "svc", "consumer_sequence": seq,
        "message_id": f"m-{seq}", "priority": "normal", "classification": "unclassified",
        "labels": "", "labels_list": [], "payload": payload,
        "payload_info": {"original_format": "json", "wrapped": False,
                         "sha256": "00" * 32, "size_bytes": 12},
        "security_labels": None,
        "metadata": {"schema": "svc.metadata.v1", "received_at": "2023-11-14T22:13:21Z",
                     "published_at": "2023-11-14T22:13:20.123456789Z", "event_time": None,
                     "delivery_count": 1, "headers": {}, "security_labels": None},
    }
    text = json.dumps(record, separators=(",", ":")).encode()
    return bytes([flags]) + struct.pack("<Q", 1_700_000_000_000) + text

one = spool_frame(spool_body(1, {"order": 1}))
two = spool_frame(spool_body(2, {"order": 2, "items": [1, 2.5, "x"]}, flags=1))
put("spool_segment", "0", one + two)
put("spool_segment", "1", one + two[:-5])                       # torn tail
put("spool_segment", "2", one[:20] + b"\x00" + one[21:] + two)   # damaged first record
put("spool_segment", "3", spool_frame(b"\x07short") + two)       # intact frame, bad body
put("spool_segment", "4", b"\xf5SR\n\xff\xff\xff\xff\x00\x00\x00\x00" + two)

# mission_metadata: selector (bit 0: the open profile with unknown fields allowed, else the
# bounded `sortie.v1`), then the header's JSON text; `ZQXJ` is the marker no refusal may show.
for i, (sel, text) in enumerate([
    (0, '{"profile":"sortie.v1","sortie_id":"S-1","wave":3,"tags":["a"],"ratio":0.5,"area":{"g":"32U"},"ok":true}'),
    (1, '{"profile":"open.v1","ZQXJ":[1,2,{"x":null}],"n":-0.5e3}'),
    (0, '{"profile":"sortie.v1","sortie_id":"ZQXJ-too-long-for-the-bound","wave":10}'),
    (1, '{"a":1,"a":2}'),
    (0, '{"profile":"sortie.v1","sortie_id":"S","wave":1,"ZQXJ":true}'),
    (1, '[[[[[[[[[[["ZQXJ"]]]]]]]]]]]'),
]):
    put("mission_metadata", f"{i}", bytes([sel]) + text.encode())

# mysql_packet: a server's byte stream (3-byte length, sequence id, payload) from sequence 0:
# handshake v10, OK, ERR, a one-column text result set, an auth switch, a LOCAL INFILE request.
def mypk(seq, payload):
    return struct.pack("<I", len(payload))[:3] + bytes([seq]) + payload
my_hello = (b"\x0a5.5.5-10.11.19-MariaDB\x00" + struct.pack("<I", 7) + b"abcdefgh\x00"
            + struct.pack("<H", 0xA808) + b"\x2d" + struct.pack("<H", 2) + struct.pack("<H", 0x0028)
            + b"\x15" + b"\x00" * 10 + b"ijklmnopqrst\x00mysql_native_password\x00")
my_ok = b"\x00\x01\x00\x02\x00\x00\x00"
my_err = b"\xff\x15\x04#28000Access denied for user"
my_coldef = b"\x03def\x00\x00\x00\x01v\x00\x0c\x21\x00\x00\x00\x00\x00\xfd\x00\x00\x00\x00\x00"
put("mysql_packet", "handshake", mypk(0, my_hello) + mypk(1, my_ok))
put("mysql_packet", "error", mypk(0, my_err))
put("mysql_packet", "resultset", mypk(0, b"\x01") + mypk(1, my_coldef) + mypk(2, b"\xfe\x00\x00\x02\x00")
    + mypk(3, b"\x01a") + mypk(4, b"\xfb") + mypk(5, b"\xfe\x00\x00\x02\x00"))
put("mysql_packet", "switch", mypk(2, b"\xfemysql_clear_password\x00abcdefghijklmnopqrst\x00"))
put("mysql_packet", "infile", mypk(1, b"\xfb/etc/passwd") + mypk(1, my_ok))
put("mysql_packet", "continued", b"\xff\xff\xff\x00" + b"x" * 16)
