//! `skein keys new`: a fresh principal key pair (a NATS user nkey). The seed alone goes to
//! standard output, so `skein keys new > alice.seed` makes the file a Secret or
//! `SKEIN_PRINCIPAL_KEY` holds; the public key and a ready `[[principals]]` entry for the
//! principals file (`SKEIN_PRINCIPALS`) go to standard error. With `--json`, standard output is
//! `{"seed": …, "public_key": …}`.
//!
//! Invariant: the entry printed is one the principals file accepts (it is parsed as one before it
//! is printed), and its key is the public half of the seed printed. Nothing is stored or sent.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use skein_common::config::{ENV_PRINCIPALS, ENV_PRINCIPAL_KEY};
use skein_common::principals::{PrincipalBook, Role, Signer};

use super::approvals::{decider, ENV_LOGIN_USER};

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub action: KeysAction,
}

#[derive(Debug, Subcommand)]
pub enum KeysAction {
    /// Print a fresh key pair: the seed on standard output (for SKEIN_PRINCIPAL_KEY), the public
    /// key and a `[[principals]]` entry on standard error.
    New(NewKeyArgs),
}

#[derive(Debug, Args)]
pub struct NewKeyArgs {
    /// The principal's name in the entry; the login name (`$USER`) when unset.
    #[arg(long)]
    pub name: Option<String>,
    /// Its tenant in the entry (`*`: an operator of every tenant).
    #[arg(long, default_value = "default")]
    pub tenant: String,
    /// A role in the entry: submit, approve, operate or delegate (repeat for several).
    #[arg(long = "role", value_name = "ROLE", value_parser = parse_role)]
    pub roles: Vec<Role>,
    /// Print `{"seed": …, "public_key": …}` on standard output instead of the seed alone.
    #[arg(long)]
    pub json: bool,
}

pub async fn keys(args: KeysArgs) -> ExitCode {
    match args.action {
        KeysAction::New(args) => super::exit_code(new_key(&args)),
    }
}

fn new_key(args: &NewKeyArgs) -> Result<(), String> {
    let name = match &args.name {
        Some(name) => name.clone(),
        None => decider(None, std::env::var(ENV_LOGIN_USER).ok().as_deref()),
    };
    let signer = Signer::generate();
    let (seed, public_key) = (signer.seed(), signer.public_key());
    let entry = entry(&name, &args.tenant, &args.roles, &public_key)?;
    if args.json {
        let pair = serde_json::json!({ "seed": seed, "public_key": public_key });
        println!("{pair}");
    } else {
        println!("{seed}");
    }
    eprintln!(
        "public key: {public_key}\n\nthe seed is the secret: give it to {name} only ({ENV_PRINCIPAL_KEY}, or a Secret file).\nadd this entry to the principals file ({ENV_PRINCIPALS}):\n\n{entry}"
    );
    Ok(())
}

/// The `[[principals]]` entry for `key`, checked to load as the principals file reads it.
fn entry(name: &str, tenant: &str, roles: &[Role], key: &str) -> Result<String, String> {
    let roles: Vec<String> = roles
        .iter()
        .map(|r| format!("\"{}\"", r.as_str()))
        .collect();
    let text = format!(
        "[[principals]]\nname = {}\ntenant = {}\nroles = [{}]\nkey = \"{key}\"\n",
        quoted(name),
        quoted(tenant),
        roles.join(", ")
    );
    PrincipalBook::parse(&text).map_err(|e| format!("the entry would not load: {e}"))?;
    Ok(text)
}

/// `text` as a TOML basic string (the file's parser then refuses what is not a valid name).
fn quoted(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c if c.is_control() => quoted.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

fn parse_role(text: &str) -> Result<Role, String> {
    serde_json::from_value(serde_json::Value::String(text.trim().to_owned()))
        .map_err(|_| format!("unknown role {text:?} (submit, approve, operate, delegate)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_loads_as_the_principal_it_names_with_the_key_of_the_seed() {
        let signer = Signer::generate();
        let key = signer.public_key();
        let text = entry("alice", "acme", &[Role::Submit, Role::Operate], &key).expect("loads");
        let book = PrincipalBook::parse(&text).expect("parses");
        let alice = book.get(&key).expect("listed by its key");
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.tenant, "acme");
        assert_eq!(alice.roles, vec![Role::Submit, Role::Operate]);
        let again = Signer::from_seed(&signer.seed()).expect("a user seed");
        assert_eq!(again.public_key(), key);
        assert!(
            entry("*", "*", &[], &key).is_err(),
            "a name must be a token"
        );
        assert!(
            entry("root", "*", &[], &key).is_ok(),
            "tenant * is an operator"
        );
        assert!(entry("a\"b", "acme", &[], &key).is_err());
    }

    #[test]
    fn roles_are_the_four_the_principals_file_knows() {
        assert_eq!(parse_role("operate"), Ok(Role::Operate));
        assert_eq!(parse_role(" delegate "), Ok(Role::Delegate));
        assert!(parse_role("admin").is_err());
    }
}
