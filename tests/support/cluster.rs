//! Test harness: a real 3-node JetStream cluster on loopback, owned by one test, with the
//! conventions of `util::NatsServer` (free ports, a temporary store per node, `/healthz`
//! readiness, kill by PID, restart on the same ports and store).
//!
//! Each node runs `nats-server -a 127.0.0.1 -p P -m M -n nodeI --cluster_name C
//! --cluster nats://127.0.0.1:R --routes <the other nodes' route URLs> -js -sd DIR`.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::broker::nats_server;
use super::net::{free_port, http_get, wait_until};

/// One node of the cluster.
pub struct Node {
    pub name: String,
    pub port: u16,
    pub monitor_port: u16,
    pub route_port: u16,
    pub store: tempfile::TempDir,
    child: Option<Child>,
}

impl Node {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn route_url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.route_port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// A JetStream cluster owned by one test. Every node is killed on drop.
pub struct Cluster {
    pub nodes: Vec<Node>,
    cluster_name: String,
}

impl Cluster {
    /// Starts `n` nodes and waits until each is healthy (JetStream joined to a meta leader).
    pub fn start(n: usize) -> Cluster {
        // A free port can be taken between our pick and the server's bind (parallel tests):
        // then start the whole cluster again on new ports.
        for _ in 0..5 {
            let mut c = Cluster {
                nodes: (0..n)
                    .map(|i| Node {
                        name: format!("node{i}"),
                        port: free_port(),
                        monitor_port: free_port(),
                        route_port: free_port(),
                        store: tempfile::tempdir().unwrap(),
                        child: None,
                    })
                    .collect(),
                cluster_name: format!("svc-test-{}", free_port()),
            };
            for i in 0..n {
                c.spawn(i);
            }
            if (0..n).all(|i| c.wait_healthy(i, Duration::from_secs(30))) {
                return c;
            }
        }
        panic!("a {n}-node JetStream cluster did not start on any of 5 port sets");
    }

    fn spawn(&mut self, i: usize) {
        let routes = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| n.route_url())
            .collect::<Vec<_>>()
            .join(",");
        let node = &self.nodes[i];
        let child = Command::new(nats_server())
            .args(["-a", "127.0.0.1", "-p", &node.port.to_string()])
            .args(["-m", &node.monitor_port.to_string()])
            .args(["-n", &node.name])
            .args(["--cluster_name", &self.cluster_name])
            .args(["--cluster", &node.route_url()])
            .args(["--routes", &routes])
            .args(["-js", "-sd"])
            .arg(node.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server must be installed (scripts/test.sh installs it)");
        self.nodes[i].child = Some(child);
    }

    /// Waits for node `i`'s `/healthz` to answer 200 while the process is still ours.
    fn wait_healthy(&mut self, i: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let node = &mut self.nodes[i];
            let Some(child) = node.child.as_mut() else {
                return false;
            };
            if child.try_wait().unwrap().is_some() {
                node.child = None;
                return false;
            }
            if matches!(http_get(node.monitor_port, "/healthz"), Some((200, _))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Every node's client URL: the seed list a runner gets.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// SIGKILL of node `i` by its PID.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts node `i` again on its ports and store, and waits until it is healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
        assert!(
            self.wait_healthy(i, Duration::from_secs(30)),
            "{} did not come back on its ports",
            self.nodes[i].name
        );
    }

    /// A client connection to any live node, reconnecting forever.
    pub fn connect(&self) -> nats::Connection {
        let urls = self
            .nodes
            .iter()
            .filter(|n| n.is_running())
            .map(Node::url)
            .collect::<Vec<_>>()
            .join(",");
        nats::Options::new()
            .max_reconnects(None)
            .connect(urls.as_str())
            .unwrap()
    }

    pub fn js(&self) -> nats::jetstream::JetStream {
        nats::jetstream::new(self.connect())
    }

    /// Creates a file stream replicated on every node (retried while the cluster settles).
    pub fn create_stream(&self, name: &str, subjects: &[&str]) {
        let js = self.js();
        let cfg = nats::jetstream::StreamConfig {
            name: name.into(),
            subjects: subjects.iter().map(|s| s.to_string()).collect(),
            storage: nats::jetstream::StorageType::File,
            num_replicas: self.nodes.len(),
            ..Default::default()
        };
        wait_until(Duration::from_secs(30), "replicated stream created", || {
            js.add_stream(cfg.clone()).is_ok()
        });
    }

    /// Creates a durable pull consumer (replicated like its stream).
    pub fn create_consumer(
        &self,
        stream: &str,
        name: &str,
        filter: &str,
        ack_wait: Duration,
        max_ack_pending: i64,
    ) {
        let js = self.js();
        let cfg = nats::jetstream::ConsumerConfig {
            durable_name: Some(name.into()),
            ack_policy: nats::jetstream::AckPolicy::Explicit,
            filter_subject: filter.into(),
            ack_wait,
            max_ack_pending,
            ..Default::default()
        };
        wait_until(Duration::from_secs(30), "consumer created", || {
            js.add_consumer(stream, cfg.clone()).is_ok()
        });
    }

    /// Index of the node leading `stream`'s RAFT group, once there is one.
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        let leader = self.js().stream_info(stream).ok()?.cluster.leader?;
        self.nodes.iter().position(|n| n.name == leader)
    }

    /// Index of the live node holding the client connection named `connection`.
    pub fn node_of_connection(&self, connection: &str) -> Option<usize> {
        self.nodes.iter().position(|n| {
            n.is_running()
                && http_get(n.monitor_port, "/connz")
                    .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
                    .and_then(|v| {
                        v["connections"]
                            .as_array()
                            .map(|cs| cs.iter().any(|c| c["name"] == connection))
                    })
                    .unwrap_or(false)
        })
    }

    /// (last stream sequence, messages held) of `stream`.
    pub fn stream_state(&self, stream: &str) -> Option<(u64, u64)> {
        let s = self.js().stream_info(stream).ok()?.state;
        Some((s.last_seq, s.messages))
    }

    /// (ack floor stream sequence, acks pending, messages not yet delivered), None while
    /// the cluster cannot answer.
    pub fn consumer_state(&self, stream: &str, consumer: &str) -> Option<(u64, usize, u64)> {
        let i = self.js().consumer_info(stream, consumer).ok()?;
        Some((i.ack_floor.stream_seq, i.num_ack_pending, i.num_pending))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}
