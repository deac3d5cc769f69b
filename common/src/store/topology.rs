//! Where the store's Redis is: one node, the primary a set of Sentinels names, or the seed nodes
//! of a Redis Cluster, read from `SKEIN_REDIS_URL` and `SKEIN_REDIS_CLUSTER`.
//!
//! The URL forms (`rediss` in place of `redis` means TLS to every node, Sentinels included):
//!
//! | form | topology |
//! | --- | --- |
//! | `redis://[[user]:password@]host[:port][/db]` | one node (the `redis` crate reads it as it is; `unix://` too) |
//! | `redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master-name[/db]` | the primary of `master-name`, as the Sentinels at those addresses (port 26379 unless given) name it; user and password are the data nodes', the Sentinels' own password is `SKEIN_REDIS_SENTINEL_PASSWORD` |
//! | `redis+cluster://[[user]:password@]host[:port][,host[:port]...]` | a Redis Cluster reached through those seed nodes (port 6379 unless given); database 0 only |
//! | `redis://...` with `SKEIN_REDIS_CLUSTER=true` | the same as `redis+cluster://...` |
//!
//! Invariants: the parsing is pure (no network); a URL that fits no form is a configuration error
//! naming what is wrong, never a guess; user and password stay percent-encoded here and are decoded
//! by the `redis` crate's own URL parser.

/// Port of a Sentinel when the URL gives none.
const SENTINEL_PORT: u16 = 26379;
/// Port of a Redis node when the URL gives none.
const REDIS_PORT: u16 = 6379;

/// Where the store's Redis is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One node, its URL as given.
    Single(String),
    /// The primary that Sentinels name.
    Sentinel(SentinelTarget),
    /// A Redis Cluster: one `redis[s]://` URL per seed node (carrying the credentials).
    Cluster(Vec<String>),
}

/// The Sentinels to ask and the primary to ask them for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelTarget {
    pub tls: bool,
    pub sentinels: Vec<(String, u16)>,
    pub master: String,
    pub db: i64,
    /// `[user]:password` as written in the URL (percent-encoded), for the data nodes.
    pub userinfo: Option<String>,
}

impl Topology {
    /// Reads the URL (and the cluster switch).
    pub(crate) fn parse(url: &str, cluster: bool) -> Result<Self, String> {
        let url = url.trim();
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(format!("{}: not a Redis URL", redacted(url)));
        };
        match scheme {
            "redis+sentinel" | "rediss+sentinel" if cluster => {
                Err("a `redis+sentinel://` URL cannot be used with SKEIN_REDIS_CLUSTER=true".into())
            }
            "redis+sentinel" | "rediss+sentinel" => {
                Self::sentinel(scheme == "rediss+sentinel", rest).map(Topology::Sentinel)
            }
            "redis+cluster" | "rediss+cluster" => {
                Self::cluster(scheme == "rediss+cluster", rest).map(Topology::Cluster)
            }
            "redis" | "rediss" if cluster => {
                Self::cluster(scheme == "rediss", rest).map(Topology::Cluster)
            }
            _ if cluster => Err(format!(
                "{}: SKEIN_REDIS_CLUSTER=true needs a redis://, rediss:// or redis+cluster:// URL",
                redacted(url)
            )),
            _ => Ok(Topology::Single(url.to_owned())),
        }
    }

    fn sentinel(tls: bool, rest: &str) -> Result<SentinelTarget, String> {
        let (userinfo, hosts, path) = split_authority(rest);
        let sentinels = hosts_of(hosts, SENTINEL_PORT)?;
        let mut parts = path.split('/').filter(|part| !part.is_empty());
        let master = parts
            .next()
            .ok_or("a redis+sentinel:// URL names the master after the hosts: redis+sentinel://host:26379/mymaster")?
            .to_owned();
        let db = match parts.next() {
            None => 0,
            Some(db) => db
                .parse::<i64>()
                .map_err(|_| format!("redis+sentinel:// database {db:?} is not a number"))?,
        };
        if let Some(extra) = parts.next() {
            return Err(format!(
                "redis+sentinel:// URL has more after the database: {extra:?}"
            ));
        }
        Ok(SentinelTarget {
            tls,
            sentinels,
            master,
            db,
            userinfo: userinfo.map(str::to_owned),
        })
    }

    fn cluster(tls: bool, rest: &str) -> Result<Vec<String>, String> {
        let (userinfo, hosts, path) = split_authority(rest);
        if !matches!(path.trim_matches('/'), "" | "0") {
            return Err("a Redis Cluster has database 0 only: drop the URL's path".into());
        }
        let scheme = if tls { "rediss" } else { "redis" };
        let credentials = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        Ok(hosts_of(hosts, REDIS_PORT)?
            .into_iter()
            .map(|(host, port)| format!("{scheme}://{credentials}{}:{port}/", bracketed(&host)))
            .collect())
    }
}

/// `[userinfo@]hosts[/path]` into its three parts (a query or fragment stays in the path).
fn split_authority(rest: &str) -> (Option<&str>, &str, &str) {
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    match rest.find('/') {
        Some(slash) => (userinfo, &rest[..slash], &rest[slash..]),
        None => (userinfo, rest, ""),
    }
}

/// `host[:port][,host[:port]...]`; an IPv6 address is written in brackets.
fn hosts_of(hosts: &str, default_port: u16) -> Result<Vec<(String, u16)>, String> {
    let found = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| host_port(host, default_port))
        .collect::<Result<Vec<_>, _>>()?;
    if found.is_empty() {
        return Err("the Redis URL names no host".into());
    }
    Ok(found)
}

fn host_port(text: &str, default_port: u16) -> Result<(String, u16), String> {
    let (host, port) = if let Some(inner) = text.strip_prefix('[') {
        let (host, after) = inner
            .split_once(']')
            .ok_or_else(|| format!("unclosed '[' in Redis host {text:?}"))?;
        (host, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(format!("empty host in Redis address {text:?}"));
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| format!("Redis port {port:?} is not a port number"))?,
    };
    Ok((host.to_owned(), port))
}

/// A host as written in a URL (IPv6 in brackets).
pub(crate) fn bracketed(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_owned()
    }
}

fn redacted(url: &str) -> String {
    crate::config::redact_url(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Topology {
        Topology::parse(url, false).expect("a valid URL")
    }

    #[test]
    fn plain_urls_are_one_node_as_written() {
        for url in [
            "redis://127.0.0.1:6379/",
            "rediss://user:pw@cache.example.com:6380/2",
            "unix:///run/redis.sock",
        ] {
            assert_eq!(parse(url), Topology::Single(url.into()));
        }
    }

    #[test]
    fn sentinel_urls_name_the_sentinels_the_master_and_the_database() {
        assert_eq!(
            parse("redis+sentinel://:s%40cret@10.0.0.1,10.0.0.2:26380,[::1]:5000/mymaster/3"),
            Topology::Sentinel(SentinelTarget {
                tls: false,
                sentinels: vec![
                    ("10.0.0.1".into(), 26379),
                    ("10.0.0.2".into(), 26380),
                    ("::1".into(), 5000)
                ],
                master: "mymaster".into(),
                db: 3,
                userinfo: Some(":s%40cret".into()),
            })
        );
        let Topology::Sentinel(target) = parse("rediss+sentinel://h:1/m") else {
            panic!("a sentinel topology");
        };
        assert!(target.tls);
        assert_eq!((target.db, target.userinfo), (0, None));
    }

    #[test]
    fn cluster_urls_become_one_url_per_seed_node() {
        let expected = Topology::Cluster(vec![
            "redis://u:p@a:7000/".into(),
            "redis://u:p@b:6379/".into(),
        ]);
        assert_eq!(parse("redis+cluster://u:p@a:7000,b"), expected);
        assert_eq!(
            Topology::parse("redis://u:p@a:7000,b/", true).expect("valid"),
            expected
        );
        assert_eq!(
            parse("rediss+cluster://a:7000"),
            Topology::Cluster(vec!["rediss://a:7000/".into()])
        );
    }

    #[test]
    fn urls_that_fit_no_form_are_refused() {
        for (url, cluster) in [
            ("redis+sentinel://h:26379", false),
            ("redis+sentinel://h:26379/m/x", false),
            ("redis+sentinel://h:26379/m/1/2", false),
            ("redis+sentinel:///m", false),
            ("redis+sentinel://h:port/m", false),
            ("redis+sentinel://h/m", true),
            ("redis+cluster://h:7000/4", false),
            ("unix:///run/redis.sock", true),
            ("127.0.0.1:6379", false),
        ] {
            assert!(
                Topology::parse(url, cluster).is_err(),
                "{url} (cluster {cluster}) is refused"
            );
        }
    }

    #[test]
    fn errors_never_show_a_password() {
        let error = Topology::parse("unix://:hunter2@/sock", true).expect_err("refused");
        assert!(!error.contains("hunter2"), "{error}");
    }
}
