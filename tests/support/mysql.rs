//! MariaDB/MySQL for the tests: connection parameters for the shared server on
//! 127.0.0.1:3306 (root without a password, as scripts/deps.sh sets it up), and a database of
//! a test's own, dropped at the end.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use svc::db::mysql::{AuthPolicy, Connection};
use svc::db::postgres::{AuthPolicy as PgAuthPolicy, ChannelBindingMode};
use svc::db::postgres::{ConnectParams, TlsMode};

pub fn my_params(database: &str, user: &str) -> ConnectParams {
    ConnectParams {
        host: "127.0.0.1".into(),
        port: 3306,
        user: user.into(),
        database: database.into(),
        application_name: "svc-e2e".into(),
        tls: TlsMode::Disable,
        tls_config: None,
        require_auth: PgAuthPolicy::default(),
        channel_binding: ChannelBindingMode::Prefer,
        scram_min_iterations: 4096,
        connect_timeout: Duration::from_secs(5),
        io_timeout: Duration::from_secs(60),
    }
}

/// A unique name for a test's database or user.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "svc_e2e_{tag}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

pub fn root() -> Connection {
    Connection::connect(&my_params("", "root"), &AuthPolicy::default(), None)
        .expect("MariaDB on 127.0.0.1:3306, root without a password (scripts/deps.sh)")
}

/// A database of its own (and the users a test creates), dropped at the end.
pub struct MyDb {
    pub name: String,
    users: Vec<String>,
}

impl MyDb {
    pub fn new(tag: &str) -> MyDb {
        let name = unique(tag);
        let mut admin = root();
        admin
            .query(&format!("DROP DATABASE IF EXISTS `{name}`"))
            .unwrap();
        admin.query(&format!("CREATE DATABASE `{name}`")).unwrap();
        MyDb {
            name,
            users: Vec::new(),
        }
    }

    pub fn conn(&self) -> Connection {
        Connection::connect(&my_params(&self.name, "root"), &AuthPolicy::default(), None).unwrap()
    }

    /// A user of this database identified by `plugin` (e.g. `mysql_native_password`) with
    /// `password`; returns its name.
    pub fn user(&mut self, plugin: &str, password: &str) -> String {
        let user = unique("u");
        let mut admin = root();
        let using = match plugin {
            "mysql_native_password" => format!("PASSWORD('{password}')"),
            _ => format!("PASSWORD('{password}')"),
        };
        admin
            .query(&format!(
                "CREATE USER '{user}'@'127.0.0.1' IDENTIFIED VIA {plugin} USING {using}"
            ))
            .unwrap_or_else(|e| panic!("create user via {plugin}: {e}"));
        admin
            .query(&format!(
                "GRANT ALL ON `{}`.* TO '{user}'@'127.0.0.1'",
                self.name
            ))
            .unwrap();
        self.users.push(user.clone());
        user
    }

    pub fn rows(&self, sql: &str) -> Vec<Vec<Option<String>>> {
        self.conn().query(sql).unwrap().rows
    }
}

impl Drop for MyDb {
    fn drop(&mut self) {
        let Ok(mut admin) =
            Connection::connect(&my_params("", "root"), &AuthPolicy::default(), None)
        else {
            return;
        };
        let _ = admin.query(&format!("DROP DATABASE IF EXISTS `{}`", self.name));
        for u in &self.users {
            let _ = admin.query(&format!("DROP USER IF EXISTS '{u}'@'127.0.0.1'"));
        }
    }
}
