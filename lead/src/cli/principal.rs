//! Who runs a command that reads or changes what tenants own (`skein dlq`, `skein sessions rm`,
//! `skein workspace`, `skein audit`, `skein approvals`): the principal the command line's own key
//! (`SKEIN_PRINCIPAL_KEY`) is listed as in the principals file (`SKEIN_PRINCIPALS`), or, with no
//! key (or no file) on a cluster that does not require signed operations, an unscoped operator
//! named by the login (`$USER`), as before principals existed.
//!
//! Invariants:
//! - a key the principals file does not list, or no key where signed operations are required, is
//!   an error before anything is read or changed;
//! - a tenant principal acts only in its own tenant and sees only its own tenant's letters and
//!   records; a principal of every tenant (`*`) and the unscoped operator see all;
//! - a listed principal acts only with the roles the file gives it (the unscoped operator is not
//!   checked: nothing proves who it is, and its records say `claimed`).
//!
//! These are the command line's own checks, so that a tenant's operator cannot act on another
//! tenant by mistake; what the broker lets a connection do is set by its NATS user.

use skein_common::audit::AuditRecord;
use skein_common::bus::Bus;
use skein_common::config::{NatsConfig, ENV_PRINCIPALS, ENV_PRINCIPAL_KEY};
use skein_common::principals::{Acting, Principal, Proof, Role, EVERY_TENANT};

use super::approvals::{decider, ENV_LOGIN_USER};

/// Who runs the command, and what it may do.
#[derive(Debug, Clone)]
pub(super) struct Caller {
    acting: Acting,
}

impl Caller {
    /// Who runs the command over `bus` (see the module documentation).
    pub fn of(bus: &Bus) -> Result<Self, String> {
        let gate = bus.gate();
        Self::resolve(
            bus.own_principal(),
            bus.signs(),
            !gate.book().is_empty(),
            gate.is_required(),
            std::env::var(ENV_LOGIN_USER).ok().as_deref(),
        )
    }

    /// [`Caller::of`] without a connection: from the settings alone (the principals file and the
    /// key), for commands that read only Redis.
    pub fn of_settings(nats: &NatsConfig) -> Result<Self, String> {
        let gate = nats.gate()?;
        let signer = nats.signer()?;
        let listed = signer
            .as_ref()
            .and_then(|signer| gate.book().get(&signer.public_key()));
        Self::resolve(
            listed,
            signer.is_some(),
            !gate.book().is_empty(),
            gate.is_required(),
            std::env::var(ENV_LOGIN_USER).ok().as_deref(),
        )
    }

    /// [`Caller::of`], from what the connection knows: the principal its key is listed as, whether
    /// it has a key, whether a principals file lists anyone, whether signatures are required.
    fn resolve(
        listed: Option<&Principal>,
        signs: bool,
        book_lists_anyone: bool,
        required: bool,
        login: Option<&str>,
    ) -> Result<Self, String> {
        if let Some(principal) = listed {
            return Ok(Self {
                acting: Acting {
                    principal: principal.clone(),
                    proof: Proof::Signed,
                    nonce: None,
                },
            });
        }
        if required {
            return Err(format!(
                "this cluster requires signed operations: set {ENV_PRINCIPAL_KEY} to a key listed in the principals file ({ENV_PRINCIPALS})"
            ));
        }
        if signs && book_lists_anyone {
            return Err(format!(
                "the key in {ENV_PRINCIPAL_KEY} is not listed in the principals file ({ENV_PRINCIPALS}): add its public key there, or unset {ENV_PRINCIPAL_KEY}"
            ));
        }
        Ok(Self {
            acting: Acting::claimed(&decider(None, login), EVERY_TENANT),
        })
    }

    pub fn name(&self) -> &str {
        self.acting.name()
    }

    /// The one tenant it acts in, or `None` for a principal of every tenant and the unscoped
    /// operator.
    pub fn tenant(&self) -> Option<&str> {
        let tenant = self.acting.principal.tenant.as_str();
        (tenant != EVERY_TENANT).then_some(tenant)
    }

    /// Whether it sees what belongs to `tenant` (`None`: to no tenant, seen only by those of
    /// every tenant).
    pub fn sees(&self, tenant: Option<&str>) -> bool {
        match self.tenant() {
            None => true,
            Some(own) => tenant == Some(own),
        }
    }

    /// Refuses, naming the principal, to `what` (say, "remove sessions") in another tenant.
    pub fn check_tenant(&self, tenant: &str, what: &str) -> Result<(), String> {
        match self.tenant() {
            Some(own) if own != tenant => Err(format!(
                "{} belongs to tenant {own} and may not {what} of tenant {tenant}",
                self.name()
            )),
            _ => Ok(()),
        }
    }

    /// Refuses, naming the principal and the role, to `what` (say, "replay dead letters")
    /// without `role`.
    pub fn check_role(&self, role: Role, what: &str) -> Result<(), String> {
        if !self.acting.is_verified() || self.acting.principal.may(role) {
            return Ok(());
        }
        let held: Vec<&str> = self
            .acting
            .principal
            .roles
            .iter()
            .map(|r| r.as_str())
            .collect();
        let held = match held.as_slice() {
            [] => "none".to_owned(),
            roles => roles.join(", "),
        };
        Err(format!(
            "{} may not {what}: that takes the role {} (the principals file gives {}: {held})",
            self.name(),
            role.as_str(),
            self.name()
        ))
    }

    /// A record of an operation it carried out on `tenant`'s `task_id` (empty: none).
    pub fn record(&self, tenant: &str, action: &str, task_id: &str) -> AuditRecord {
        AuditRecord::done(&self.acting, tenant, action, task_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(tenant: &str, roles: &[Role]) -> Principal {
        Principal {
            name: "alice".into(),
            tenant: tenant.into(),
            roles: roles.to_vec(),
        }
    }

    #[test]
    fn a_listed_key_is_its_principal_signed() {
        let acme = principal("acme", &[Role::Operate]);
        let caller = Caller::resolve(Some(&acme), true, true, true, Some("bob")).expect("listed");
        assert_eq!(caller.name(), "alice");
        assert_eq!(caller.acting.proof, Proof::Signed);
        assert_eq!(caller.tenant(), Some("acme"));
    }

    #[test]
    fn without_a_listed_key_the_caller_is_refused_or_unscoped() {
        let required = Caller::resolve(None, false, true, true, Some("bob")).expect_err("required");
        assert!(
            required.contains("requires signed operations")
                && required.contains("SKEIN_PRINCIPAL_KEY")
        );
        let unlisted = Caller::resolve(None, true, true, false, None).expect_err("unlisted");
        assert!(unlisted.contains("not listed"), "{unlisted}");
        for (signs, book) in [(false, false), (false, true), (true, false)] {
            let caller = Caller::resolve(None, signs, book, false, Some("bob")).expect("unscoped");
            assert_eq!(caller.name(), "bob");
            assert_eq!(caller.acting.proof, Proof::Claimed);
            assert_eq!(caller.tenant(), None);
            assert!(caller.sees(None) && caller.sees(Some("globex")));
            assert!(caller
                .check_role(Role::Operate, "purge dead letters")
                .is_ok());
            assert!(caller.check_tenant("globex", "remove sessions").is_ok());
        }
    }

    #[test]
    fn a_tenant_principal_sees_and_acts_only_in_its_tenant_with_its_roles() {
        let viewer = principal("acme", &[Role::Submit]);
        let caller = Caller::resolve(Some(&viewer), true, true, false, None).expect("listed");
        assert!(caller.sees(Some("acme")));
        assert!(!caller.sees(Some("globex")) && !caller.sees(None));
        assert!(caller.check_tenant("acme", "remove sessions").is_ok());
        let other = caller
            .check_tenant("globex", "remove sessions")
            .expect_err("another tenant");
        assert!(
            other.contains("alice") && other.contains("globex"),
            "{other}"
        );
        let role = caller
            .check_role(Role::Operate, "replay dead letters")
            .expect_err("no operate");
        assert!(
            role.contains("alice") && role.contains("operate") && role.contains("submit"),
            "{role}"
        );

        let operator = principal(EVERY_TENANT, &[Role::Operate]);
        let caller = Caller::resolve(Some(&operator), true, true, true, None).expect("listed");
        assert_eq!(caller.tenant(), None);
        assert!(caller.sees(None) && caller.sees(Some("globex")));
        assert!(caller
            .check_role(Role::Operate, "purge dead letters")
            .is_ok());
        assert!(caller.check_role(Role::Approve, "approve").is_err());
    }
}
