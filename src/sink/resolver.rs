//! Name resolution for the HTTP agents of the sinks that speak HTTP through ureq: the
//! object-store sink's S3 client (`object_store/client.rs`) and the HTTP sink's client
//! (`http/client.rs`). Each agent has its own resolver, so its one-entry cache holds the one
//! endpoint that agent talks to.
//!
//! Why not ureq's default resolver: ureq resolves the host before it looks in its connection
//! pool, so it resolves on every request, even one that reuses a kept-alive connection and
//! never looks at the addresses. With a request timeout set (always, here) the default
//! resolver spawns a thread per resolution so the lookup can be abandoned at the deadline. At
//! one request per object that is one thread spawned and torn down per object (a tenth of the
//! client's CPU in the end-to-end bench, measured with `perf`) plus, for a host name, one DNS
//! query per object.
//!
//! This resolver answers an IP literal (`127.0.0.1:9000`, `[::1]:9000`) by parsing it, and
//! keeps the answer for a host name for [`TTL`]; a miss or an expired answer goes to ureq's
//! default resolver, so a lookup still obeys the request timeout. The addresses are only used
//! when the pool has to open a new connection.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// How long a host name's addresses are reused. S3's DNS answers carry a TTL of a few seconds
/// (it spreads clients over its front ends that way), so a new connection opened after this
/// long sees a fresh answer.
pub const TTL: Duration = Duration::from_secs(5);

/// ureq's default resolver behind a one-entry cache and an IP-literal shortcut.
#[derive(Debug, Default)]
pub struct CachingResolver {
    inner: DefaultResolver,
    /// `host:port` and its addresses, with the time they were resolved. One entry: a client
    /// talks to one endpoint.
    last: Mutex<Option<(String, ResolvedSocketAddrs, Instant)>>,
}

impl Resolver for CachingResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            // Let the default resolver report the bad URI.
            return self.inner.resolve(uri, config, timeout);
        };
        let Some(host_port) = DefaultResolver::host_and_port(scheme, authority) else {
            return self.inner.resolve(uri, config, timeout);
        };
        if let Ok(addr) = host_port.parse::<SocketAddr>() {
            let mut out = self.inner.empty();
            for a in config.ip_family().keep_wanted(std::iter::once(addr)) {
                out.push(a);
            }
            return if out.is_empty() {
                Err(ureq::Error::HostNotFound)
            } else {
                Ok(out)
            };
        }
        {
            let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((key, addrs, at)) = last.as_ref() {
                if *key == host_port && at.elapsed() < TTL {
                    return Ok(addrs.clone());
                }
            }
        }
        // Invariant: the lock is not held during the lookup (it may take up to the timeout).
        let addrs = self.inner.resolve(uri, config, timeout)?;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((host_port, addrs.clone(), Instant::now()));
        Ok(addrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(r: &CachingResolver, uri: &str) -> Result<Vec<SocketAddr>, ureq::Error> {
        let uri: Uri = uri.parse().unwrap();
        let config = Config::default();
        let timeout = NextTimeout {
            after: std::time::Duration::from_secs(5).into(),
            reason: ureq::Timeout::Resolve,
            per_read: None,
            per_write: None,
        };
        r.resolve(&uri, &config, timeout)
            .map(|a| a.iter().copied().collect())
    }

    #[test]
    fn ip_literals_are_parsed_not_cached() {
        let r = CachingResolver::default();
        assert_eq!(
            resolve(&r, "http://127.0.0.1:9000/b/k").unwrap(),
            vec!["127.0.0.1:9000".parse::<SocketAddr>().unwrap()]
        );
        assert_eq!(
            resolve(&r, "https://[::1]/b").unwrap(),
            vec!["[::1]:443".parse::<SocketAddr>().unwrap()]
        );
        assert!(r.last.lock().unwrap().is_none());
    }

    #[test]
    fn host_names_are_cached_per_host() {
        let r = CachingResolver::default();
        let first = resolve(&r, "http://localhost:9000/b/k").unwrap();
        assert!(!first.is_empty());
        assert!(first.iter().all(|a| a.port() == 9000));
        let (key, _, at) = r.last.lock().unwrap().clone().unwrap();
        assert_eq!(key, "localhost:9000");
        // A hit returns the same answer without touching the entry.
        assert_eq!(resolve(&r, "http://localhost:9000/other").unwrap(), first);
        assert_eq!(r.last.lock().unwrap().as_ref().unwrap().2, at);
        // Another port is another entry.
        let other = resolve(&r, "http://localhost:9001/b").unwrap();
        assert!(other.iter().all(|a| a.port() == 9001));
        assert_eq!(r.last.lock().unwrap().as_ref().unwrap().0, "localhost:9001");
    }
}
