//! The `relational_db` sink block: connection without secrets, TLS mode, tables and routing.
//!
//! The reference for every field is `docs/sinks/relational.md`.

use std::path::PathBuf;

use crate::document::grammar::is_env_var_name;

use crate::document::reader::ObjectReader;
use crate::message::subject::{SubjectPattern, SubjectRule, SubjectRules};

use crate::db::params::TlsMode;
use crate::db::postgres::auth::{AuthPolicy, ChannelBindingMode};

/// A validated table name, optionally schema-qualified.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TableName {
    pub schema: Option<String>,
    pub name: String,
}

impl TableName {
    /// Parses `name` or `schema.name`; each part `[a-z_][a-z0-9_]*`, at most 63 bytes (the
    /// server's identifier limit). Lowercase only, so the quoted SQL name equals what an
    /// operator types unquoted in psql.
    pub fn parse(text: &str) -> Result<TableName, &'static str> {
        let parts: Vec<&str> = text.split('.').collect();
        let ok = |p: &str| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        let msg = "must be a lowercase identifier ([a-z_][a-z0-9_]*, at most 63 characters), \
                   optionally schema-qualified as schema.table";
        match parts.as_slice() {
            [name] if ok(name) => Ok(TableName {
                schema: None,
                name: name.to_string(),
            }),
            [schema, name] if ok(schema) && ok(name) => Ok(TableName {
                schema: Some(schema.to_string()),
                name: name.to_string(),
            }),
            _ => Err(msg),
        }
    }

    /// The quoted SQL name, e.g. `"audit"."events"`.
    pub fn sql(&self) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{}\"", self.name),
            None => format!("\"{}\"", self.name),
        }
    }

    /// A constraint or index name derived from the table (schema-less, at most 63 bytes).
    pub fn derived(&self, suffix: &str) -> String {
        let mut base = self.name.clone();
        base.truncate(63 - suffix.len() - 1);
        format!("{base}_{suffix}")
    }
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// One subject-to-table rule.
#[derive(Debug, Clone, PartialEq)]
pub struct TableRoute {
    pub subject: SubjectPattern,
    pub table: TableName,
}

impl SubjectRule for TableRoute {
    fn pattern(&self) -> &SubjectPattern {
        &self.subject
    }
}

/// The parsed DSN: where to connect and as whom. Never holds a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dsn {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub database: String,
    /// `mysql://` or `mariadb://` (the `mysql` engine), else `postgresql://`.
    pub mysql: bool,
}

impl Dsn {
    /// Parses `postgresql://USER@HOST[:PORT]/DATABASE` (`postgres://` too), or for the
    /// `mysql` engine `mysql://USER@HOST[:PORT]/DATABASE` (`mariadb://` too; port 3306 by
    /// default). Errors never quote the input: it may hold a password.
    pub fn parse(text: &str) -> Result<Dsn, &'static str> {
        let mysql_rest = text
            .strip_prefix("mysql://")
            .or_else(|| text.strip_prefix("mariadb://"));
        let mysql = mysql_rest.is_some();
        let rest = mysql_rest
            .or_else(|| text.strip_prefix("postgresql://"))
            .or_else(|| text.strip_prefix("postgres://"))
            .ok_or(
                "must start with postgresql:// or mysql:// (form \
                 postgresql://USER@HOST[:PORT]/DATABASE)",
            )?;
        if rest.contains('?') || rest.contains('#') {
            return Err(
                "must not have query parameters or a fragment; use the sink's own fields \
                        (tls_mode, tls_ca_file, password_env, ...)",
            );
        }
        let (authority, database) = rest
            .split_once('/')
            .ok_or("must name a database (postgresql://USER@HOST[:PORT]/DATABASE)")?;
        let (userinfo, hostport) = authority
            .rsplit_once('@')
            .ok_or("must name a user (postgresql://USER@HOST[:PORT]/DATABASE)")?;
        if userinfo.contains(':') {
            return Err(
                "must not contain a password; name an environment variable in \
                        password_env instead",
            );
        }
        let user = percent_decode(userinfo).ok_or("has an invalid percent-escape in the user")?;
        let database =
            percent_decode(database).ok_or("has an invalid percent-escape in the database")?;
        if user.is_empty() || user.len() > 63 || user.contains('\0') {
            return Err("must name a user of 1 to 63 bytes");
        }
        if database.is_empty() || database.len() > 63 || database.contains('\0') {
            return Err("must name a database of 1 to 63 bytes");
        }
        if hostport.contains(',') {
            return Err("must name exactly one host");
        }
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or("has an unterminated [ipv6] host")?;
            match after {
                "" => (h.to_string(), None),
                p => (
                    h.to_string(),
                    Some(p.strip_prefix(':').ok_or("has an invalid port")?),
                ),
            }
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (hostport.to_string(), None),
            }
        };
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'_'));
        if !host_ok {
            return Err("must name a host (letters, digits, '.', '-', or an [ipv6] address)");
        }
        let port = match port {
            None if mysql => 3306,
            None => 5432,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or("must have a port from 1 to 65535")?,
        };
        Ok(Dsn {
            host,
            port,
            user,
            database,
            mysql,
        })
    }

    /// True for `localhost`, `127.0.0.0/8` and `::1`.
    pub fn is_loopback(&self) -> bool {
        self.host == "localhost"
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The database engine a `relational_db` sink writes to (`sink.engine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    PostgreSql,
    /// MySQL 8 or MariaDB 10.6+ (the in-tree client in `mysql/`).
    Mysql,
}

/// How rows are written (`sink.write_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// A key already stored counts as stored (same event) or is a collision: never a second
    /// row, never an overwrite.
    Insert,
    /// Newer content replaces: the row of a key is overwritten by a message of a higher (or
    /// equal) stream sequence, never by an older one.
    Upsert,
}

/// The `relational_db` sink block.
#[derive(Debug, Clone, PartialEq)]
pub struct RelationalConfig {
    /// `postgresql` (default) or `mysql`.
    pub engine: Engine,
    /// Authentication plugins a MySQL server may ask for (`require_auth` of the `mysql`
    /// engine).
    pub mysql_require_auth: crate::db::mysql::AuthPolicy,
    /// `insert` (default) or `upsert`.
    pub write_mode: WriteMode,
    /// For `upsert`: a JSON pointer into the payload whose value is the row's key (else the
    /// idempotency key, i.e. the stream sequence or message ID).
    pub key_field: Option<String>,
    pub dsn: Dsn,
    /// Environment variable holding the password; read at each connect, never stored.
    pub password_env: Option<String>,
    pub tls_mode: TlsMode,
    /// PEM trust anchors for `verify_full`; the system store when absent.
    pub tls_ca_file: Option<PathBuf>,
    /// Authentication methods the server may ask for (libpq's `require_auth`).
    pub require_auth: AuthPolicy,
    /// SCRAM channel binding (libpq's `channel_binding`).
    pub channel_binding: ChannelBindingMode,
    /// Fewest SCRAM-SHA-256 iterations the server may ask for. Defaults to 4096.
    pub scram_min_iterations: u32,
    /// Default table: subjects no route matches.
    pub table: TableName,
    /// Subject-to-table rules, first match wins.
    pub routes: SubjectRules<TableRoute>,
    /// Create missing tables (`CREATE TABLE IF NOT EXISTS`) on each new connection.
    pub auto_create_tables: bool,
    pub application_name: String,
    pub connect_timeout_seconds: u64,
    pub statement_timeout_seconds: u64,
}

impl RelationalConfig {
    pub fn read(r: &mut ObjectReader<'_>) -> RelationalConfig {
        let engine = r.one_of(
            "engine",
            Engine::PostgreSql,
            &[("postgresql", Engine::PostgreSql), ("mysql", Engine::Mysql)],
        );
        let (write_mode, key_field) = read_write_mode(r);
        let dsn_text = r.req_string("dsn");
        let dsn = if dsn_text.is_empty() {
            None
        } else {
            match Dsn::parse(&dsn_text) {
                Ok(d) => Some(d),
                Err(msg) => {
                    r.problem("dsn", msg);
                    None
                }
            }
        };
        if let Some(d) = &dsn {
            if d.mysql != (engine == Engine::Mysql) {
                r.problem(
                    "dsn",
                    "its scheme does not match sink.engine (mysql:// or mariadb:// for engine \
                     mysql, postgresql:// for engine postgresql)",
                );
            }
        }
        let password_env = r.opt_string("password_env");
        if let Some(name) = &password_env {
            if !is_env_var_name(name) {
                r.problem(
                    "password_env",
                    "must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*), not a password",
                );
            }
        }
        let tls_mode = r.one_of(
            "tls_mode",
            TlsMode::VerifyFull,
            &[
                ("verify_full", TlsMode::VerifyFull),
                ("disable", TlsMode::Disable),
            ],
        );
        if tls_mode == TlsMode::Disable {
            if let Some(d) = &dsn {
                if !d.is_loopback() {
                    r.problem(
                        "tls_mode",
                        "disable is allowed only for a loopback host (localhost, 127.0.0.1, ::1)",
                    );
                }
            }
        }
        let tls_ca_file = r.opt_nonempty("tls_ca_file").map(PathBuf::from);
        if tls_ca_file.is_some() && tls_mode == TlsMode::Disable {
            r.problem("tls_ca_file", "is only used with tls_mode verify_full");
        }
        let auth_text = r.opt_string("require_auth");
        let mut mysql_require_auth = crate::db::mysql::AuthPolicy::default();
        let require_auth = match auth_text {
            Some(text) if engine == Engine::Mysql => {
                match crate::db::mysql::AuthPolicy::parse(&text) {
                    Ok(p) => mysql_require_auth = p,
                    Err(msg) => r.problem("require_auth", msg),
                }
                AuthPolicy::default()
            }
            None => AuthPolicy::default(),
            Some(text) => AuthPolicy::parse(&text).unwrap_or_else(|msg| {
                r.problem("require_auth", msg);
                AuthPolicy::default()
            }),
        };
        if r.bool_or("allow_rsa_key_exchange", false) {
            if engine != Engine::Mysql {
                r.problem("allow_rsa_key_exchange", "is only used with engine mysql");
            } else if !mysql_require_auth.caching_sha2 {
                r.problem(
                    "allow_rsa_key_exchange",
                    "needs caching_sha2_password in sink.require_auth",
                );
            }
            mysql_require_auth.rsa_key_exchange = true;
        }
        if (require_auth.password || require_auth.md5) && password_env.is_none() {
            r.problem(
                "require_auth",
                "allows a password method (md5 or password) but sink.password_env is not set",
            );
        }
        let channel_binding = r.one_of(
            "channel_binding",
            ChannelBindingMode::Prefer,
            &[
                ("prefer", ChannelBindingMode::Prefer),
                ("require", ChannelBindingMode::Require),
                ("disable", ChannelBindingMode::Disable),
            ],
        );
        if channel_binding == ChannelBindingMode::Require {
            check_required_binding(r, tls_mode, &require_auth);
        }
        let scram_min_iterations = r.int_in(
            "scram_min_iterations",
            i64::from(crate::db::postgres::auth::DEFAULT_SCRAM_MIN_ITERATIONS),
            1,
            i64::from(crate::db::postgres::auth::MAX_SCRAM_ITERATIONS),
        ) as u32;
        let table_text = r.req_string("table");
        let table = table_named(r, &table_text);
        let routes = read_routes(r);
        let auto_create_tables = r.bool_or("auto_create_tables", false);
        let application_name = read_application_name(r);
        let connect_timeout_seconds = r.int_in("connect_timeout_seconds", 10, 1, 300) as u64;
        let statement_timeout_seconds = r.int_in("statement_timeout_seconds", 30, 1, 3600) as u64;

        RelationalConfig {
            engine,
            mysql_require_auth,
            write_mode,
            key_field,
            dsn: dsn.unwrap_or(Dsn {
                host: String::new(),
                port: 5432,
                user: String::new(),
                database: String::new(),
                mysql: engine == Engine::Mysql,
            }),
            password_env,
            tls_mode,
            tls_ca_file,
            require_auth,
            channel_binding,
            scram_min_iterations,
            table: table.unwrap_or(TableName {
                schema: None,
                name: String::new(),
            }),
            routes: SubjectRules::new(routes),
            auto_create_tables,
            application_name,
            connect_timeout_seconds,
            statement_timeout_seconds,
        }
    }

    /// The table a subject's rows go to: first matching route, else the default table.
    pub fn table_for(&self, subject: &str) -> &TableName {
        self.routes
            .first_match(subject)
            .map(|(_, r)| &r.table)
            .unwrap_or(&self.table)
    }

    /// Every distinct table, default first, then route tables in rule order.
    pub fn tables(&self) -> Vec<&TableName> {
        let mut out = vec![&self.table];
        for r in &self.routes {
            if !out.contains(&&r.table) {
                out.push(&r.table);
            }
        }
        out
    }
}

/// `write_mode` and `key_field` (a JSON pointer, only with `upsert`).
fn read_write_mode(r: &mut ObjectReader<'_>) -> (WriteMode, Option<String>) {
    let write_mode = r.one_of(
        "write_mode",
        WriteMode::Insert,
        &[("insert", WriteMode::Insert), ("upsert", WriteMode::Upsert)],
    );
    let key_field = r.opt_string("key_field");
    if let Some(k) = &key_field {
        if write_mode != WriteMode::Upsert {
            r.problem("key_field", "is only used with write_mode upsert");
        } else if !k.starts_with('/') || k.len() > 256 {
            r.problem(
                "key_field",
                "must be a JSON pointer into the payload (RFC 6901, e.g. /order/id), at most \
                     256 characters",
            );
        }
    }
    (write_mode, key_field)
}

/// `channel_binding: require` needs TLS and SCRAM (the binding is a property of both).
fn check_required_binding(r: &mut ObjectReader<'_>, tls_mode: TlsMode, auth: &AuthPolicy) {
    if tls_mode == TlsMode::Disable {
        r.problem(
            "channel_binding",
            "require needs tls_mode verify_full (channel binding is a property of tls)",
        );
    }
    if !auth.scram_sha_256 {
        r.problem(
            "channel_binding",
            "require needs scram-sha-256 in sink.require_auth",
        );
    }
}

/// The table named by field `table` (read as `text`); None, with the problem recorded, when
/// it is empty or not a table name.
fn table_named(r: &mut ObjectReader<'_>, text: &str) -> Option<TableName> {
    if text.is_empty() {
        return None;
    }
    TableName::parse(text)
        .map_err(|msg| r.problem("table", msg))
        .ok()
}

/// `routes`: subject pattern -> table, at most [`crate::message::subject::MAX_RULES`].
fn read_routes(r: &mut ObjectReader<'_>) -> Vec<TableRoute> {
    let mut routes = Vec::new();
    let route_readers = r.objects_at_most("routes", crate::message::subject::MAX_RULES);
    for mut rr in route_readers {
        let subject = rr.req_string("subject");
        let t = rr.req_string("table");
        let subject = if subject.is_empty() {
            None
        } else {
            SubjectPattern::parse(&subject)
                .map_err(|e| rr.problem("subject", e.to_string()))
                .ok()
        };
        let t = table_named(&mut rr, &t);
        if let (Some(subject), Some(table)) = (subject, t) {
            routes.push(TableRoute { subject, table });
        }
        rr.finish();
    }
    routes
}

fn read_application_name(r: &mut ObjectReader<'_>) -> String {
    let name = r.string_or("application_name", "svc");
    if name.is_empty() || name.len() > 63 || !name.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        r.problem(
            "application_name",
            "must be 1 to 63 printable ASCII characters",
        );
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::reader::{parse_json, Problems};

    fn read(text: &str) -> (RelationalConfig, Vec<String>) {
        let v = parse_json(text).unwrap();
        let p = Problems::new();
        let mut r = ObjectReader::at("sink".into(), &v, &p);
        let c = RelationalConfig::read(&mut r);
        r.finish();
        (c, p.into_vec().iter().map(|p| p.to_string()).collect())
    }

    #[test]
    fn engine_mysql_dsn_and_plugins() {
        let (c, p) = read(
            r#"{"engine":"mysql","dsn":"mariadb://svc@db.example/audit","table":"events",
                "require_auth":"caching_sha2_password"}"#,
        );
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.engine, Engine::Mysql);
        assert_eq!((c.dsn.port, c.dsn.mysql), (3306, true));
        assert!(c.mysql_require_auth.caching_sha2 && !c.mysql_require_auth.native);
        assert!(!c.mysql_require_auth.rsa_key_exchange, "off by default");
        let (c, p) = read(
            r#"{"engine":"mysql","dsn":"mariadb://svc@db.example/audit","table":"events",
                "allow_rsa_key_exchange":true}"#,
        );
        assert!(
            p.is_empty() && c.mysql_require_auth.rsa_key_exchange,
            "{p:?}"
        );
        for bad in [
            r#"{"engine":"mysql","dsn":"mysql://svc@db/x","table":"t","allow_rsa_key_exchange":true,
                "require_auth":"mysql_native_password"}"#,
            r#"{"dsn":"postgresql://svc@db/x","table":"t","allow_rsa_key_exchange":true}"#,
        ] {
            let (_, p) = read(bad);
            assert!(
                p.iter().any(|m| m.contains("sink.allow_rsa_key_exchange")),
                "{p:?}"
            );
        }
        let (c, _) = read(r#"{"dsn":"postgresql://svc@db/x","table":"t"}"#);
        assert_eq!(c.engine, Engine::PostgreSql);
        let (_, p) = read(r#"{"engine":"mysql","dsn":"postgresql://svc@db/x","table":"t"}"#);
        assert!(
            p.iter()
                .any(|m| m.contains("sink.dsn") && m.contains("engine")),
            "{p:?}"
        );
        let (_, p) = read(r#"{"dsn":"mysql://svc@db/x","table":"t"}"#);
        assert!(p.iter().any(|m| m.contains("does not match")), "{p:?}");
        let (_, p) = read(
            r#"{"engine":"mysql","dsn":"mysql://svc@db/x","table":"t","require_auth":"mysql_clear_password"}"#,
        );
        assert!(
            p.iter()
                .any(|m| m.contains("sink.require_auth") && m.contains("cleartext")),
            "{p:?}"
        );
        let (c, p) = read(r#"{"dsn":"postgresql://svc@db/x","table":"t","write_mode":"upsert"}"#);
        assert!(p.is_empty() && c.write_mode == WriteMode::Upsert, "{p:?}");
        let (_, p) =
            read(r#"{"engine":"mysql","dsn":"mysql://svc@db/x","table":"t","key_field":"/id"}"#);
        assert!(
            p.iter()
                .any(|m| m.contains("sink.key_field") && m.contains("upsert")),
            "{p:?}"
        );
        let (c, p) = read(
            r#"{"engine":"mysql","dsn":"mysql://svc@db/x","table":"t","write_mode":"upsert","key_field":"id"}"#,
        );
        assert!(p.iter().any(|m| m.contains("JSON pointer")), "{p:?}");
        assert_eq!(c.write_mode, WriteMode::Upsert);
        let (_, p) = read(r#"{"engine":"oracle","dsn":"mysql://svc@db/x","table":"t"}"#);
        assert!(p.iter().any(|m| m.contains("sink.engine")), "{p:?}");
    }

    #[test]
    fn minimal_block_and_defaults() {
        let (c, problems) =
            read(r#"{"dsn": "postgresql://svc@db.example:6432/events", "table": "events"}"#);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            c.dsn,
            Dsn {
                host: "db.example".into(),
                port: 6432,
                user: "svc".into(),
                database: "events".into(),
                mysql: false
            }
        );
        assert_eq!(c.tls_mode, TlsMode::VerifyFull);
        assert_eq!(c.table.sql(), "\"events\"");
        assert_eq!(c.connect_timeout_seconds, 10);
        assert_eq!(c.statement_timeout_seconds, 30);
        assert_eq!(c.scram_min_iterations, 4096);
        assert!(!c.auto_create_tables);
        assert_eq!(c.application_name, "svc");
    }

    #[test]
    fn password_in_dsn_is_rejected_without_echo() {
        for dsn in [
            "postgresql://svc:hunter2@db/events",
            "postgres://svc:hunter2@127.0.0.1:5432/events",
        ] {
            let (_, problems) = read(&format!(r#"{{"dsn": "{dsn}", "table": "t"}}"#));
            assert_eq!(
                problems,
                vec![
                    "sink.dsn: must not contain a password; name an environment variable in \
                      password_env instead"
                ]
            );
            assert!(!problems[0].contains("hunter2"));
        }
        let (_, problems) =
            read(r#"{"dsn": "postgresql://svc@db/events?password=hunter2", "table": "t"}"#);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("sink.dsn: must not have query parameters"));
        assert!(!problems[0].contains("hunter2"));
    }

    /// Route lists are capped as every other subject rule list is (the index's memory).
    #[test]
    fn routes_are_capped() {
        let routes = |n: usize| {
            let list: Vec<String> = (0..n)
                .map(|i| format!(r#"{{"subject": "s{i}.>", "table": "t"}}"#))
                .collect();
            read(&format!(
                r#"{{"dsn": "postgresql://svc@db/events", "table": "t", "routes": [{}]}}"#,
                list.join(",")
            ))
            .1
        };
        assert_eq!(routes(1000), Vec::<String>::new());
        assert_eq!(
            routes(1001),
            vec!["sink.routes: must have at most 1000 entries"]
        );
    }

    #[test]
    fn every_problem_is_reported() {
        let (_, problems) = read(
            r#"{"dsn": "oracle://x", "password_env": "hunter 2", "tls_mode": "prefer",
                "table": "Events", "routes": [{"subject": "a..b", "table": "x.y.z"}, {"table": "ok"}],
                "application_name": "", "connect_timeout_seconds": 0, "extra": 1}"#,
        );
        assert_eq!(
            problems,
            vec![
                "sink.dsn: must start with postgresql:// or mysql:// (form postgresql://USER@HOST[:PORT]/DATABASE)",
                "sink.password_env: must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*), not a password",
                "sink.tls_mode: must be one of: verify_full, disable",
                "sink.table: must be a lowercase identifier ([a-z_][a-z0-9_]*, at most 63 characters), optionally schema-qualified as schema.table",
                "sink.routes[0].subject: must not contain empty tokens",
                "sink.routes[0].table: must be a lowercase identifier ([a-z_][a-z0-9_]*, at most 63 characters), optionally schema-qualified as schema.table",
                "sink.routes[1].subject: is required",
                "sink.application_name: must be 1 to 63 printable ASCII characters",
                "sink.connect_timeout_seconds: must be an integer from 1 to 300",
                "sink.extra: unknown field",
            ]
        );
    }

    #[test]
    fn plaintext_only_to_loopback() {
        let (_, p) = read(
            r#"{"dsn": "postgresql://svc@db.example/events", "table": "t", "tls_mode": "disable"}"#,
        );
        assert_eq!(
            p,
            vec!["sink.tls_mode: disable is allowed only for a loopback host (localhost, 127.0.0.1, ::1)"]
        );
        for host in ["127.0.0.1", "localhost", "[::1]", "127.9.9.9:5433"] {
            let (_, p) = read(&format!(
                r#"{{"dsn": "postgresql://svc@{host}/events", "table": "t", "tls_mode": "disable"}}"#
            ));
            assert!(p.is_empty(), "{host}: {p:?}");
        }
        let (_, p) = read(
            r#"{"dsn": "postgresql://svc@127.0.0.1/e", "table": "t", "tls_mode": "disable", "tls_ca_file": "/x.pem"}"#,
        );
        assert_eq!(
            p,
            vec!["sink.tls_ca_file: is only used with tls_mode verify_full"]
        );
    }

    #[test]
    fn require_auth_and_channel_binding() {
        let (c, p) = read(r#"{"dsn": "postgresql://u@db/e", "table": "t"}"#);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.require_auth, AuthPolicy::default());
        assert_eq!(c.channel_binding, ChannelBindingMode::Prefer);
        let (c, p) = read(
            r#"{"dsn": "postgresql://u@db/e", "table": "t", "password_env": "PW",
                "require_auth": "scram-sha-256,md5", "channel_binding": "require"}"#,
        );
        assert!(p.is_empty(), "{p:?}");
        assert!(c.require_auth.md5 && c.require_auth.scram_sha_256);
        assert_eq!(c.channel_binding, ChannelBindingMode::Require);
        let (_, p) = read(
            r#"{"dsn": "postgresql://u@127.0.0.1/e", "table": "t", "tls_mode": "disable",
                "require_auth": "md5,!password", "channel_binding": "require"}"#,
        );
        assert_eq!(
            p,
            vec![
                "sink.require_auth: negated methods (!name) are not supported; list the allowed \
                 methods (scram-sha-256, md5, password, none)",
                "sink.channel_binding: require needs tls_mode verify_full (channel binding is a \
                 property of tls)",
            ]
        );
        let (_, p) = read(
            r#"{"dsn": "postgresql://u@db/e", "table": "t", "require_auth": "md5",
                "channel_binding": "always"}"#,
        );
        assert_eq!(
            p,
            vec![
                "sink.require_auth: allows a password method (md5 or password) but \
                 sink.password_env is not set",
                "sink.channel_binding: must be one of: prefer, require, disable",
            ]
        );
        let (_, p) = read(
            r#"{"dsn": "postgresql://u@db/e", "table": "t", "require_auth": "none",
                "channel_binding": "require"}"#,
        );
        assert_eq!(
            p,
            vec!["sink.channel_binding: require needs scram-sha-256 in sink.require_auth"]
        );
    }

    #[test]
    fn dsn_shapes() {
        let d = Dsn::parse("postgresql://a%40b@[::1]:5433/my%20db").unwrap();
        assert_eq!(
            (d.user.as_str(), d.host.as_str(), d.port),
            ("a@b", "::1", 5433)
        );
        assert_eq!(d.database, "my db");
        assert!(d.is_loopback());
        for bad in [
            "postgresql://db/events",
            "postgresql://u@db",
            "postgresql://u@/events",
            "postgresql://u@db:0/e",
            "postgresql://u@db:99999/e",
            "postgresql://u@a,b/e",
            "postgresql://u@db/",
            "postgresql://@db/e",
            "postgresql://u@d b/e",
            "postgresql://u%zz@db/e",
        ] {
            assert!(Dsn::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn table_names_and_routing() {
        assert_eq!(
            TableName::parse("audit.events").unwrap().sql(),
            "\"audit\".\"events\""
        );
        for bad in [
            "",
            "a.b.c",
            "Events",
            "1x",
            "a-b",
            "a;drop",
            "x\"y",
            &"a".repeat(64),
        ] {
            assert!(TableName::parse(bad).is_err(), "{bad}");
        }
        let (c, p) = read(
            r#"{"dsn": "postgresql://u@127.0.0.1/e", "table": "other",
                "routes": [{"subject": "orders.eu.*", "table": "eu_orders"},
                           {"subject": "orders.>", "table": "audit.orders"},
                           {"subject": "billing.>", "table": "eu_orders"}]}"#,
        );
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(c.table_for("orders.eu.created").name, "eu_orders");
        assert_eq!(c.table_for("orders.us.created").to_string(), "audit.orders");
        assert_eq!(c.table_for("misc").name, "other");
        let names: Vec<String> = c.tables().iter().map(|t| t.to_string()).collect();
        assert_eq!(names, vec!["other", "eu_orders", "audit.orders"]);
    }
}
