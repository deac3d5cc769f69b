use super::*;

const SUBJECT: &str = "skein.approval.acme.t1";
const BODY: &[u8] = br#"{"approve":true}"#;

struct Fixture {
    alice: Signer,
    gateway: Signer,
    gate: Gate,
}

fn fixture(required: bool) -> Fixture {
    let alice = Signer::generate();
    let gateway = Signer::generate();
    let book = PrincipalBook::parse(&format!(
        r#"
[[principals]]
name = "alice"
tenant = "acme"
roles = ["submit", "approve"]
key = "{}"

[[principals]]
name = "gateway"
tenant = "*"
roles = ["delegate", "submit", "approve", "operate"]
key = "{}"
"#,
        alice.public_key(),
        gateway.public_key()
    ))
    .expect("the book parses");
    Fixture {
        alice,
        gateway,
        gate: Gate::new(book, required, Duration::from_secs(300)),
    }
}

fn signed(signer: &Signer, on_behalf: Option<(&str, &[Role])>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    signer.sign(&mut headers, SUBJECT, BODY, on_behalf);
    headers
}

fn presented(headers: &HeaderMap) -> Presented<'_> {
    Presented {
        subject: SUBJECT,
        headers: Some(headers),
        payload: BODY,
        stored_at_ms: crate::protocol::now_ms(),
    }
}

#[test]
fn a_listed_principal_s_signature_proves_it_whatever_the_message_claims() {
    let f = fixture(true);
    let headers = signed(&f.alice, None);
    let acting = f
        .gate
        .check(
            presented(&headers),
            "acme",
            Operation::Approve,
            "mallory",
            false,
        )
        .expect("alice may approve");
    assert_eq!(acting.name(), "alice");
    assert_eq!(acting.proof, Proof::Signed);
    assert!(acting.nonce.is_some());
}

#[test]
fn forged_altered_expired_foreign_and_unsigned_operations_are_refused_with_their_reason() {
    let f = fixture(true);
    let reason = |result: Result<Acting, Refusal>| result.expect_err("refused").reason;

    // Signed by an unlisted key that claims alice's public key.
    let mut forged = signed(&Signer::generate(), None);
    forged.insert(HEADER_PRINCIPAL, f.alice.public_key().as_str());
    let why = reason(
        f.gate
            .check(presented(&forged), "acme", Operation::Approve, "", false),
    );
    assert!(why.contains("does not verify"), "{why}");

    // A good signature over another body.
    let headers = signed(&f.alice, None);
    let mut altered = presented(&headers);
    altered.payload = br#"{"approve":false}"#;
    let why = reason(f.gate.check(altered, "acme", Operation::Approve, "", false));
    assert!(why.contains("does not verify"), "{why}");

    // Moved to another task's subject.
    let mut moved = presented(&headers);
    moved.subject = "skein.approval.acme.t2";
    let why = reason(f.gate.check(moved, "acme", Operation::Approve, "", false));
    assert!(why.contains("does not verify"), "{why}");

    // Stored long after it was signed.
    let mut late = presented(&headers);
    late.stored_at_ms += 301_000;
    let why = reason(f.gate.check(late, "acme", Operation::Approve, "", false));
    assert!(why.contains("expired"), "{why}");

    // Another tenant's task.
    let why = reason(
        f.gate
            .check(presented(&headers), "globex", Operation::Approve, "", false),
    );
    assert!(why.contains("may not act on tenant globex"), "{why}");

    // A role alice lacks.
    let why = reason(
        f.gate
            .check(presented(&headers), "acme", Operation::Pause, "", false),
    );
    assert!(
        why.contains("may not pause") && why.contains("operate"),
        "{why}"
    );

    // Unknown key.
    let stranger = signed(&Signer::generate(), None);
    let why = reason(
        f.gate
            .check(presented(&stranger), "acme", Operation::Approve, "", false),
    );
    assert!(why.contains("unknown principal key"), "{why}");

    // Unsigned.
    let none = HeaderMap::new();
    let why = reason(
        f.gate
            .check(presented(&none), "acme", Operation::Approve, "alice", false),
    );
    assert!(why.contains("unsigned approve"), "{why}");
}

#[test]
fn without_the_requirement_an_unsigned_message_keeps_its_claim_marked_as_one() {
    let f = fixture(false);
    let none = HeaderMap::new();
    let acting = f
        .gate
        .check(presented(&none), "acme", Operation::Approve, "bob", false)
        .expect("allowed");
    assert_eq!((acting.name(), acting.is_verified()), ("bob", false));
    // A signed one is still checked.
    let mut forged = signed(&Signer::generate(), None);
    forged.insert(HEADER_PRINCIPAL, f.alice.public_key().as_str());
    assert!(f
        .gate
        .check(presented(&forged), "acme", Operation::Approve, "", false)
        .is_err());
}

#[test]
fn a_process_without_principals_takes_a_signed_message_at_its_word() {
    let gate = Gate::open();
    let headers = signed(&Signer::generate(), None);
    let acting = gate
        .check(
            presented(&headers),
            "acme",
            Operation::Approve,
            "carol",
            false,
        )
        .expect("nothing to check against");
    assert_eq!((acting.name(), acting.is_verified()), ("carol", false));
}

#[test]
fn a_delegate_acts_for_the_caller_it_names_with_that_caller_s_roles() {
    let f = fixture(true);
    let headers = signed(&f.gateway, Some(("olga", &[Role::Approve])));
    let acting = f
        .gate
        .check(presented(&headers), "acme", Operation::Approve, "", false)
        .expect("olga may approve");
    assert_eq!(acting.name(), "olga");
    assert_eq!(
        acting.proof,
        Proof::Delegated {
            by: "gateway".into()
        }
    );
    let refused = f
        .gate
        .check(presented(&headers), "acme", Operation::Pause, "", false)
        .expect_err("olga may not pause");
    assert_eq!(refused.principal.as_deref(), Some("olga"));

    // Changing whom it acts for breaks the signature; a non-delegate may not name anyone.
    let mut changed = headers.clone();
    changed.insert(HEADER_ON_BEHALF_ROLES, "approve,operate");
    assert!(f
        .gate
        .check(presented(&changed), "acme", Operation::Pause, "", false)
        .is_err());
    let by_alice = signed(&f.alice, Some(("olga", &[Role::Approve])));
    let why = f
        .gate
        .check(presented(&by_alice), "acme", Operation::Approve, "", false)
        .expect_err("alice is no delegate")
        .reason;
    assert!(why.contains("no delegate role"), "{why}");
}

#[test]
fn a_principals_file_with_a_mistake_names_it() {
    for (text, needle) in [
        (
            "[[principals]]\nname = \"a\"\ntenant = \"acme\"\nroles = [\"root\"]\nkey = \"UX\"\n",
            "unknown role",
        ),
        (
            "[[principals]]\nname = \"a\"\ntenant = \"acme\"\nkey = \"not-a-key\"\n",
            "public user nkey",
        ),
        (
            "[[principals]]\nname = \"a b\"\ntenant = \"acme\"\nkey = \"UX\"\n",
            "principal 1",
        ),
    ] {
        let error = PrincipalBook::parse(text).expect_err("refused");
        assert!(error.contains(needle), "{error}");
    }
    let seed = Signer::generate().seed();
    assert!(Signer::from_seed(&seed).is_ok());
    assert!(Signer::from_seed("SUnot-a-seed")
        .expect_err("refused")
        .contains("user nkey seed"));
}
