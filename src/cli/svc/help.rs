//! The hand-written help texts of `svc`: the global one and one per command, so
//! `svc <command> --help` answers the question about that command only.

pub const HELP: &str = "\
svc - message-delivery runner: JetStream pull consumer -> one sink, commit first, ACK last

USAGE:
    svc validate <config_file>    check the configuration (no network access)
    svc show-effective-config <config_file>
                                  print the whole configuration with every default filled
                                  in (validated first; the output is itself a valid config)
    svc run <config_file>         deliver until SIGTERM/SIGINT (SIGUSR1 logs a pipeline dump)
    svc inspect <config_file> [--last N | --start-seq S | --since TIME] [--subject S]
                [--max N] [--timeout SECONDS] [--format text|jsonl] [--payload]
                                  read-only look at the configured stream: what the runner
                                  would make of each message; never acknowledges
    svc replay <config_file> [--start-seq S] [--end-seq E] [--since T] [--until T]
                [--subject S] [--sink FILE | --fanout-child NAME] [--state FILE]
                [--resume] [--dry-run] [--max-rate N] [--timeout SECONDS]
                                  deliver a range of the stream again through the runner's
                                  normalizer into the sink; never touches the durable consumer
                                  (docs/replay.md)
    svc stream-plan <config_file> [--format text|json] [--apply] [stream options]
                                  what the broker must hold for the config: stream, durable
                                  consumer, dead-letter stream, the runner user's permissions;
                                  --apply creates what is missing (never changes what exists)
    svc test-sink <config_file>   initialize the configured sink and prove it is usable
    svc init-db <config_file> [--print]
                                  create the relational sink's tables (every relational_db
                                  sink, fan-out children included); --print only prints the DDL
    svc decrypt <config_file> <record_file | ->
                                  print the plaintext payload of each stored record (file
                                  record, object-store object, relational row as JSON; one per
                                  line in JSON lines); any configured key, rotated ones included
    svc verify-custody <config_file> <record_file>...
    svc verify-custody <config_file> --public-key [ID=]FILE... [--head RUNNER:INDEX:DIGEST...]
                                  recompute each record's custody digest and report it intact
                                  or altered (exit 1 when any is altered or unverifiable)
    svc spool status|inspect|drain|set-aside <config_file>
                                  the spool (docs/spool.md): what waits in it, its records,
                                  deliver it to its sink, or set one record aside

    svc dlq list|show <config_file> [options]
                                  read-only look at the dead-letter stream: its records
                                  counted by stage/reason and subject, or one shown
    svc dlq redrive <config_file> [--reason R] [--class C] [--since T] [--subject S]
                [--sink FILE] [--state FILE] [--resume] [--dry-run] [--max-rate N]
                                  deliver each dead letter's original again (fetched from the
                                  stream by sequence) and remove the record once it is stored
                                  (docs/replay.md)

    svc <command> --help          the command's own help

OPTIONS:
    -h, --help       print this help
    -V, --version    print the version

EXIT CODES:
    0  success (run: clean stop after a signal)
    1  runtime failure (broker, sink, test-sink verdict)
    2  invalid configuration or usage
    3  replay, dlq redrive: finished, some messages refused (governance or sink) or
       (redrive) some records kept: original missing or not redrivable; dlq list: the
       counts are partial
    4  replay, dlq redrive: stopped by a signal (--resume continues)

Configuration reference: docs/configuration.md
";

const REPLAY: &str = "\
Usage: svc replay <config_file> [options]

Delivers a range of the configured stream again, through the same normalizer as `svc run`
(metadata, labels, governance, authenticity, encryption, custody) into the configured sink or
the one given by --sink. Reads through an ephemeral consumer of its own: the durable consumer
is never touched and nothing is acknowledged. The range is fixed at the start: messages
published later are not taken. Progress is recorded durably after every batch; --resume
continues after a crash or Ctrl-C, never skipping a message. Keyed sinks (file per_event,
object store, relational) store nothing twice and count \"already present\"; jsonl and HTTP
have no keys (docs/replay.md).

Range (default: the whole stream as it is now):
    --start-seq S      first stream sequence (at most one of --start-seq, --since)
    --end-seq E        last stream sequence (at most the stream's last at the start)
    --since TIME       first message stored at or after TIME (RFC 3339)
    --until TIME       stop at the first message stored after TIME (RFC 3339)
    --subject S        only this subject filter, within nats.subject / nats.subjects

Delivery:
    --sink FILE        a sink block in its own JSON file instead of the configured sink
    --fanout-child NAME
                       only this child of the configured fan-out sink (its routes do not
                       apply: every message of the range goes to the child)
    --dry-run          read and normalize, write nothing: the summary says what would be stored
    --max-rate N       at most N messages per second (1 to 1000000)
    --state FILE       the progress file (default: <config_file>.replay-state)
    --resume           continue the replay recorded in the state file
    --timeout SECONDS  connect, and wait at most this long for each message (default 10)

Progress goes to standard error (a redrawn line on a terminal, a plain line every 10 s
otherwise); the summary (read, stored, already present, refused by governance, refused by the
sink, dead-lettered) to standard output. Refusals go to the dead-letter queue when
dead_letter.enabled, marked \"replayed\": true.

Exit codes: 0 done, 1 error (broker, sink, state file; --resume continues), 2 invalid
configuration or usage, 3 done with refusals, 4 stopped by a signal (--resume continues).
";

/// Every command, in the order the help lists them.
pub const COMMANDS: &[&str] = &[
    "validate",
    "show-effective-config",
    "run",
    "inspect",
    "replay",
    "stream-plan",
    "test-sink",
    "init-db",
    "decrypt",
    "verify-custody",
    "spool",
    "dlq",
];

const VALIDATE: &str = "\
Usage: svc validate <config_file>

Checks the configuration without touching the network: every problem is reported at once,
each with its field path (an unknown field names the nearest known one). On success prints
`Configuration is valid.`, the active sink, the ACK policy and a one-paragraph summary:
stream, consumer and subject, sink (and fan-out children), protections, dead-letter queue,
metrics snapshot.

Exit codes: 0 valid, 2 invalid or unreadable.
";

const SHOW_EFFECTIVE_CONFIG: &str = "\
Usage: svc show-effective-config <config_file>

Validates the configuration (the same problems and exit code as `svc validate`), then prints
it as JSON with every default filled in, the sink's and every fan-out child's included, in the
order of docs/configuration.md. A field the runner decides from others when it is left out
is shown as decided (nats.tls_required: true with a tls:// URL; nats.consumer_mode); one whose
absence has its own meaning is shown as null. The values of a URL's query and of a header with
a secret name are shown as <redacted>. Names of environment
variables and key files are shown as written; no value is read from the environment or a file.
The output is itself a valid configuration, and reads back to the same output.

Exit codes: 0 printed, 2 invalid or unreadable.
";

const RUN: &str = "\
Usage: svc run <config_file>

Delivers messages from the configured stream's durable pull consumer to the sink: each batch
is committed durably first and acknowledged after. Runs until SIGTERM or SIGINT (in-flight
batches finish; nothing is acknowledged early); SIGUSR1 logs a pipeline dump.

Exit codes: 0 clean stop after a signal, 1 runtime failure (broker, sink), 2 invalid
configuration. A failure is printed once, through the configured log format.
";

const INSPECT: &str = "\
Usage: svc inspect <config_file> [--last N | --start-seq S | --since TIME] [--subject S]
                   [--max N] [--timeout SECONDS] [--format text|jsonl] [--payload]

Reads messages of the configured stream through an ephemeral consumer of its own (no
acknowledgement, one delivery each, in stream order): the durable consumer is never touched,
nothing is acknowledged, and the consumer is deleted at the end (the broker drops it after 5 s
without interest if the process is killed). Shows per message: stream sequence, time, subject,
size, headers (values of secret-looking names as <redacted>), what the runner would make of it:
payload format, priority, classification and labels, the authenticity verdict when configured,
the governance verdict when a governance stage is on (stored with its mission metadata, or the
stage, reason and field that would refuse it; the record-bytes bound only the runner measures),
the fan-out children it would be routed to. Payloads only with --payload; never decrypts.

  --last N          the last N messages of the stream (those the filter matches); default 10
  --start-seq S     from stream sequence S
  --since TIME      from the first message stored at or after TIME (RFC 3339)
  --subject S       narrow the configured subject (must lie within it)
  --max N           at most N messages (1 to 10000); default 100 (--last N: N)
  --timeout SECONDS stop when nothing arrives for this long (1 to 300); default 5;
                    also the most one attempt to connect to a server may take
  --format F        text (one line per message, the default) or jsonl
  --payload         include payloads (UTF-8 as text, anything else base64 in jsonl)

Exit codes: 0 read, 1 broker failure, 2 invalid configuration, options or a missing key.
";

const STREAM_PLAN: &str = "\
Usage: svc stream-plan <config_file> [--format text|json] [--apply] [--user NAME]
                       [--storage file|memory] [--replicas N] [--retention limits|interest|workqueue]
                       [--discard old|new] [--duplicate-window D] [--max-age D]
                       [--max-bytes B] [--max-msgs N] [--dlq-stream NAME]

Prints, from the configuration alone (no network access), what the broker must hold for
`svc run`: the stream capturing nats.subject, the durable pull consumer exactly as `svc run`
creates it, the dead-letter stream when dead_letter is enabled, and the permissions of the
runner's NATS user: exactly the subjects it publishes and subscribes to, nothing more.

  --format F             text (the default, with warnings such as replicas 1 or memory
                         storage) or json: the stream and consumer as JetStream API requests,
                         the permissions as a nats-server `authorization` block
  --user NAME            the user named in the authorization block; default svc
  --storage S            file (default) or memory
  --replicas N           1 to 5; default 1
  --retention R          limits (default: messages stay after delivery), interest, workqueue
  --discard P            new (default: a full stream refuses publishes) or old (deletes the
                         oldest messages, delivered or not)
  --duplicate-window D   default 2m
  --max-age D            default 7d; D is seconds or <n>s|m|h|d, or unlimited
  --max-bytes B          default 1G; B is bytes or <n>K|M|G|T, or unlimited
  --max-msgs N           default unlimited
  --dlq-stream NAME      the dead-letter stream; default dead_letter.expected_stream, else
                         <stream>_DLQ
  --apply                after printing, create what is missing (stream, dead-letter stream,
                         consumer) exactly as planned; an existing one that differs from the
                         plan is reported on standard error and left unchanged. Connects with
                         the config's URLs and TLS settings and an administrator's credentials
                         from SVC_ADMIN_NATS_USER + SVC_ADMIN_NATS_PASSWORD, SVC_ADMIN_NATS_TOKEN
                         or SVC_ADMIN_NATS_CREDS (a .creds file); none set: no credentials

Exit codes: 0 printed (and applied: everything as planned), 1 broker failure or something
existing differs from the plan, 2 invalid configuration or options.
";

const TEST_SINK: &str = "\
Usage: svc test-sink <config_file>

Initializes the configured sink and proves it is usable (writes and removes a probe where the
sink allows it). Prints `Sink <type> is usable: ...` or `Sink <type> is NOT usable: ...`.

Exit codes: 0 usable, 1 not usable, 2 invalid configuration.
";

const INIT_DB: &str = "\
Usage: svc init-db <config_file> [--print]

Creates the tables of every relational_db sink of the configuration (fan-out children
included; for sink.type spool, its target). --print only prints the DDL, connecting to
nothing.

Exit codes: 0 ready, 1 a database refused, 2 invalid configuration or no relational_db sink.
";

const DECRYPT: &str = "\
Usage: svc decrypt <config_file> <record_file | ->

Prints the plaintext payload of each stored record (a file-sink record, an object-store
object, a relational row as JSON; one per line in JSON lines) with any configured key,
rotated ones included. `-` reads standard input.

Exit codes: 0 every record decrypted, 1 a record could not be, 2 invalid configuration.
";

const VERIFY_CUSTODY: &str = "\
Usage: svc verify-custody <config_file> <record_file>...
       svc verify-custody <config_file> --public-key [ID=]FILE... [--head RUNNER:INDEX:DIGEST...]

Recomputes each record's custody digest and reports it intact or ALTERED.

With --public-key (no secret needed): reads the configured sink's records and its signed
custody checkpoints, and reports records MISSING from a signed checkpoint (by sequence),
ALTERED, present in no checkpoint yet, and checkpoints forged, signed by an unknown key, or
removed from (BROKEN) or FORKED in a runner's chain. FILE holds the Ed25519 public key (base64
of 32 bytes or an SPKI PEM), trusted under key id ID (default custody.checkpoints.key_id).
--head RUNNER:INDEX:DIGEST (repeatable): a chain head held outside the sink (the runner's
\"custody checkpoint head\" log line or head file); a chain that does not reach it is reported
TRUNCATED, a runner with no chain MISSING, another checkpoint at that index DIFFERS.

Exit codes: 0 every record intact (with --public-key: complete), 1 any finding,
2 invalid configuration or key.
";

const SPOOL: &str = "\
Usage: svc spool status <config_file> [--json]
       svc spool inspect <config_file> [--payload]
       svc spool drain <config_file> [--public-key [ID=]FILE]...
       svc spool set-aside <config_file> --segment S --offset O

status   the spool's records, bytes, oldest record's age, segments, rejected records and
         files, quarantine files, damage not yet quarantined; one JSON object with --json
         (read-only; safe beside a runner)
inspect  one JSON line per waiting record: stream, sequence, subject, sizes; the payload only
         with --payload; then rejected records, quarantine files, damage and a summary
         (read-only)
drain    deliver the spool to its sink (the configured sink, or sink.target when sink.type is
         spool) and exit when empty; refused while a runner holds the spool. Custody
         checkpoint frames go into the sink's checkpoint store, each checked first with
         the --public-key keys (Ed25519: base64 of 32 bytes or an SPKI PEM, under key id
         ID, default custody.checkpoints.key_id), else the configuration's own signing key;
         a frame stored in clear must verify, one that does not is quarantined
set-aside
         move the one record at segment S offset O, which the drain or the opening stops
         at and no configuration should read (put there by someone else), into a quarantine
         file (its bytes kept, never deleted); the drain then moves past it; refused while a
         runner holds the spool

The spool is the config's `spool` block or `sink.type: \"spool\"` (docs/spool.md).

Exit codes: 0 success, 1 runtime failure (spool locked, sink failure), 2 invalid configuration
or usage.
";

const DLQ: &str = "\
Usage: svc dlq list <config_file> [--stage S] [--reason R] [--subject S] [--since TIME]
                    [--max N] [--timeout SECONDS] [--format text|json]
       svc dlq show <config_file> <sequence> [--timeout SECONDS] [--format text|json]
       svc dlq redrive <config_file> [--reason R] [--class C] [--subject S] [--since TIME]
                    [--sink FILE | --fanout-child NAME] [--state FILE] [--resume]
                    [--dry-run] [--max-rate N] [--timeout SECONDS]

A read-only look at the dead-letter stream (the one stream that captures dead_letter.subject):
nothing is acknowledged, moved or deleted. `list` reads its records through an ephemeral
consumer of its own, as `svc inspect` reads the source stream, and counts them by
stage/reason and by original subject (at most 1000 of each one by one, the rest together;
each cut at 256 characters),
with the oldest and newest record; `show` prints the record stored at that sequence of the
dead-letter stream. Everything printed is escaped for the terminal.

  --stage S         only records refused by this stage (security_labels, sink, ...)
  --reason R        only records with this reason code (too_large, not_in_vocabulary, ...)
  --subject S       only records whose original subject matches this pattern
  --since TIME      only records stored at or after TIME (RFC 3339)
  --max N           read at most N records (1 to 1000000); default 1000000
  --timeout SECONDS stop when nothing arrives for this long (1 to 300); default 5; also the
                    most one attempt to connect or one read may take
  --format F        text (the default) or json (one JSON document)

`redrive` reads the records (those at the start only) and, for each the filters select,
fetches its original from nats.stream by the sequence the record names (STREAM.MSG.GET,
read-only; a record naming another stream is never followed), runs it through the runner's
normalizer into the configured sink (or --sink FILE) and removes the record from the
dead-letter stream only once the message is stored or already present. A message refused
again is dead-lettered anew (marked \"replayed\" and \"redriven_from\") and then its old record
is removed. A record whose original the stream no longer holds is reported and kept.

  --class C         only records of this failure stage (as --stage)
  --sink FILE       a sink block in its own JSON file instead of the configured sink
  --fanout-child NAME  into that child of the configured fan-out sink only
  --dry-run         fetch and normalize, write and remove nothing
  --max-rate N      at most N records per second
  --state FILE      the progress file (default: <config_file>.redrive-state)
  --resume          continue the redrive recorded in the state file

Exit codes (list, show): 0 read, 1 broker failure or no record at that sequence, 2 invalid
configuration or options, or dead_letter not enabled, 3 (list) the counts are partial: --max
reached with records left, or the read timed out (stderr says which). Redrive: 0 every
selected record delivered and removed, 1 error (--resume continues), 2 invalid input, 3 done with records
refused again or kept, 4 stopped by a signal (--resume continues).
";

/// The help of `command`, the global help for an unknown one.
pub fn of(command: Option<&str>) -> &'static str {
    match command {
        Some("validate") => VALIDATE,
        Some("show-effective-config") => SHOW_EFFECTIVE_CONFIG,
        Some("run") => RUN,
        Some("inspect") => INSPECT,
        Some("replay") => REPLAY,
        Some("stream-plan") => STREAM_PLAN,
        Some("test-sink") => TEST_SINK,
        Some("init-db") => INIT_DB,
        Some("decrypt") => DECRYPT,
        Some("verify-custody") => VERIFY_CUSTODY,
        Some("spool") => SPOOL,
        Some("dlq") => DLQ,
        _ => HELP,
    }
}
