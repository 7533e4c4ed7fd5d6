//! The client against a scripted server (wiremock standing in for pagos): what it retries,
//! with which key, how long it waits, what it refuses to retry, and what the journal keeps.

mod helpers;

use futures::StreamExt;
use helpers::{
    API_KEY, TestJournal, answer, client, fast_policy, first, in_flight, intent,
    journal_and_client, key_of, keys_sent, look_ups, nothing_sent, pago, pagos_pay, pagos_refund,
    paid, paid_replay, posts, posts_answer, posts_seen, problem, reembolso, refunds, reset, tell,
    then, unavailable, until,
};
use pagos_client::{
    Client, Intent, Journal, Outcome, PayError, PayPolicy, PaymentRequest, PaymentState,
    ProblemType, RefundIntent, RefundOutcome, RefundRequest, RefundState, Waiting,
};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use uuid::Uuid;
use wiremock::{MockServer, ResponseTemplate};

#[tokio::test]
async fn a_connection_dropped_after_the_commit_is_retried_with_the_same_key_and_pays_once() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    first(
        posts().respond_with_err(reset("committed, then dropped")),
        &server,
    )
    .await;
    then(posts().respond_with(paid_replay(id)).expect(1), &server).await;
    let (journal, client, notices) = journal_and_client(&server, fast_policy()).await;
    let intent = intent();

    let outcome = client.pay(&intent).await.expect("an outcome");

    assert!(
        matches!(&outcome, Outcome::Paid(p) if p.id == id),
        "{outcome:?}"
    );
    let seen = posts_seen(&server).await;
    assert_eq!(seen.len(), 2, "the dropped request and its retry");
    for request in &seen {
        assert_eq!(key_of(request), intent.key().as_str());
        assert_eq!(request.body, seen[0].body, "the same body every time");
        assert_eq!(
            request.headers["authorization"],
            format!("Bearer {API_KEY}")
        );
    }
    let notices = notices.all();
    assert_eq!(notices.len(), 1);
    assert!(
        matches!(&notices[0].waiting, Waiting::Failed { why, .. } if why.starts_with("connection lost")),
        "{notices:?}"
    );
    assert!(
        journal.pending().await.is_empty(),
        "a paid intent leaves the journal"
    );
}

#[tokio::test]
async fn a_409_with_retry_after_is_waited_out_and_the_replay_pays_with_the_same_key() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    first(posts().respond_with(in_flight()), &server).await;
    then(posts().respond_with(paid_replay(id)), &server).await;
    let (_journal, client, notices) = journal_and_client(&server, fast_policy()).await;
    let intent = intent();

    let started = Instant::now();
    let outcome = client.pay(&intent).await.expect("an outcome");

    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was not honoured ({:?})",
        started.elapsed()
    );
    assert!(matches!(outcome, Outcome::Paid(p) if p.id == id));
    let keys: Vec<_> = keys_sent(&server).await;
    assert_eq!(keys, [intent.key().as_str(), intent.key().as_str()]);
    let notices = notices.all();
    assert_eq!(notices.len(), 1);
    assert!(notices[0].wait >= Duration::from_secs(1));
    assert!(matches!(
        &notices[0].waiting,
        Waiting::Failed { why, retry_after: Some(ra) } if why.starts_with("409") && *ra == Duration::from_secs(1)
    ));
}

#[tokio::test]
async fn busy_or_failing_answers_are_retried_with_the_same_key() {
    for status in [429, 500, 502, 504] {
        let server = MockServer::start().await;
        first(posts().respond_with(unavailable(status, "Busy")), &server).await;
        then(posts().respond_with(paid(Uuid::new_v4())), &server).await;
        let (_journal, client, _) = journal_and_client(&server, fast_policy()).await;
        let intent = intent();

        let outcome = client.pay(&intent).await;

        assert!(
            matches!(outcome, Ok(Outcome::Paid(_))),
            "{status}: {outcome:?}"
        );
        let keys: Vec<_> = keys_sent(&server).await;
        assert_eq!(
            keys,
            [intent.key().as_str(), intent.key().as_str()],
            "{status}"
        );
    }
}

#[tokio::test]
async fn a_422_400_or_401_is_not_retried_and_is_a_typed_error_with_the_problems_title() {
    for (status, slug, title) in [
        (422, "validation-failed", "Request failed validation"),
        (
            400,
            "idempotency-key-malformed",
            "Idempotency-Key header malformed",
        ),
        (401, "unauthorized", "Missing or invalid credentials"),
    ] {
        let server = MockServer::start().await;
        posts_answer(&server, answer(status, problem(status, slug, title)), 1).await;
        let (journal, client, notices) = journal_and_client(&server, fast_policy()).await;

        let err = client.pay(&intent()).await.expect_err("refused");

        match &err {
            PayError::Rejected { status: s, problem } => {
                assert_eq!(*s, status);
                assert_eq!(problem.title, title);
                assert_eq!(problem.slug(), slug);
            }
            other => panic!("{status}: not a rejection: {other:?}"),
        }
        assert_eq!(err.problem().map(|p| p.title.as_str()), Some(title));
        assert!(err.to_string().contains(title), "{err}");
        assert!(notices.all().is_empty(), "{status} was retried");
        server.verify().await;
        assert!(
            journal.pending().await.is_empty(),
            "{status} on the first request: the server never had the intent"
        );
    }
}

#[tokio::test]
async fn a_refusal_after_a_request_with_unknown_outcome_keeps_the_intent() {
    let server = MockServer::start().await;
    first(posts().respond_with_err(reset("dropped")), &server).await;
    then(
        posts()
            .respond_with(answer(
                401,
                problem(401, "unauthorized", "Missing or invalid credentials"),
            ))
            .expect(1),
        &server,
    )
    .await;
    let (journal, client, _) = journal_and_client(&server, fast_policy()).await;
    let intent = intent();

    let err = client.pay(&intent).await.expect_err("refused");

    assert!(
        matches!(err, PayError::Rejected { status: 401, .. }),
        "{err:?}"
    );
    let kept = journal.pending().await;
    assert_eq!(
        kept.len(),
        1,
        "the first request may have paid: keep the intent"
    );
    assert_eq!(kept[0].intent, intent);
    assert_eq!(kept[0].attempts, 2);
    assert!(
        kept[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.starts_with("401"))
    );
}

#[tokio::test]
async fn a_reused_key_is_reported_loudly_and_never_sent_again_without_a_human() {
    let server = MockServer::start().await;
    posts_answer(
        &server,
        answer(
            422,
            problem(
                422,
                "idempotency-key-reused",
                "Idempotency-Key already used with another request",
            ),
        ),
        1,
    )
    .await;
    let (journal, client, notices) = journal_and_client(&server, fast_policy()).await;
    let intent = intent();

    let err = client.pay(&intent).await.expect_err("refused");

    match &err {
        PayError::KeyReused { key, problem } => {
            assert_eq!(key, intent.key());
            assert_eq!(
                problem.title,
                "Idempotency-Key already used with another request"
            );
        }
        other => panic!("not KeyReused: {other:?}"),
    }
    assert!(err.to_string().contains(intent.key().as_str()));
    assert!(notices.all().is_empty());
    let kept = journal.pending().await;
    assert_eq!(kept.len(), 1);
    assert!(kept[0].blocked.is_some(), "kept, and blocked");

    let again = client.pay(&intent).await.expect_err("blocked");
    assert!(matches!(again, PayError::Blocked { .. }), "{again:?}");
    let resumed = client.resume().await.expect("resume");
    assert_eq!(resumed.len(), 1);
    assert!(matches!(resumed[0].result, Err(PayError::Blocked { .. })));
    server.verify().await;
}

#[tokio::test]
async fn a_503_forever_is_given_up_within_the_total_time_and_the_intent_stays_in_the_journal() {
    let server = MockServer::start().await;
    posts()
        .respond_with(
            unavailable(503, "Service temporarily unavailable").insert_header("Retry-After", "0"),
        )
        .mount(&server)
        .await;
    let total = Duration::from_millis(1500);
    let policy = PayPolicy {
        deadline: total,
        max_attempts: 1000,
        min_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(100),
        ..fast_policy()
    };
    let (journal, client, _) = journal_and_client(&server, policy).await;
    let intent = intent();

    let started = Instant::now();
    let err = client.pay(&intent).await.expect_err("gave up");
    let elapsed = started.elapsed();

    assert!(
        elapsed <= total + Duration::from_millis(500),
        "took {elapsed:?}"
    );
    let sent = posts_seen(&server).await.len();
    match &err {
        PayError::GaveUp { attempts, last, .. } => {
            assert_eq!(*attempts as usize, sent);
            // The last try's 503, or, when the deadline came while it was in flight (a
            // busy machine), that try cut short by it.
            assert!(
                last.starts_with("503") || last.starts_with("no answer in time"),
                "{last}"
            );
            assert!(last.ends_with("(deadline reached)"), "{last}");
        }
        other => panic!("not GaveUp: {other:?}"),
    }
    assert!(sent > 3, "it kept trying until the deadline: {sent}");
    let kept = journal.pending().await;
    assert_eq!(kept.len(), 1, "the outcome is unknown: the intent stays");
    assert_eq!(kept[0].intent, intent);
    assert_eq!(kept[0].attempts as usize, sent);
}

#[tokio::test]
async fn attempts_are_capped_by_the_policy() {
    let server = MockServer::start().await;
    posts_answer(&server, unavailable(503, "Unavailable"), 3).await;
    let policy = PayPolicy {
        max_attempts: 3,
        ..fast_policy()
    };
    let (_journal, client, notices) = journal_and_client(&server, policy).await;

    let err = client.pay(&intent()).await.expect_err("gave up");

    assert!(
        matches!(&err, PayError::GaveUp { attempts: 3, last, .. } if last.contains("attempts")),
        "{err:?}"
    );
    let attempts: Vec<u32> = notices.all().iter().map(|n| n.attempt).collect();
    assert_eq!(attempts, [1, 2]);
    server.verify().await;
}

/// The server named the payment (202), then lost it (its database restored from before
/// it, a replica behind): its look-up answers 404. Before, the client read it for ever
/// and the intent stayed kept with a 404 at every resume, while the customer may have been
/// charged; now it posts again with the same key, which makes the same payment and gateway
/// key on the server, so the gateway answers the charge it made.
#[tokio::test]
async fn a_payment_the_server_named_and_then_lost_is_posted_again_with_the_same_key() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    first(
        posts().respond_with(answer(202, pago(id, "ENVIADA"))),
        &server,
    )
    .await;
    then(posts().respond_with(paid(id)), &server).await;
    look_ups(id)
        .respond_with(answer(404, problem(404, "not-found", "Not Found")))
        .mount(&server)
        .await;
    let (journal, client, _) = journal_and_client(&server, fast_policy()).await;
    let intent = intent();

    let outcome = client.pay(&intent).await.expect("an outcome");

    assert!(
        matches!(&outcome, Outcome::Paid(p) if p.id == id),
        "{outcome:?}"
    );
    let keys = keys_sent(&server).await;
    assert_eq!(keys, [intent.key().to_string(), intent.key().to_string()]);
    assert!(journal.pending().await.is_empty(), "settled");
}

/// But only pagos' own "no such payment" (a proxy's 404 page says nothing about the
/// payment: refused, kept with its id), and only within `LOST_PAYMENT_RESEND` of the first
/// send, checked before every `POST`: past it the gateway may have let the key go and a
/// resend could charge twice, so the intent is blocked for a human, with its id and what
/// to check, and nothing is posted.
#[tokio::test]
async fn a_lost_payment_is_not_posted_again_on_a_proxys_404_or_past_the_resend_limit() {
    let limit = pagos_client::LOST_PAYMENT_RESEND;
    for (age, body, lost) in [
        (
            chrono::TimeDelta::minutes(5),
            ResponseTemplate::new(404).set_body_raw("<h1>Not Found</h1>", "text/html"),
            false,
        ),
        (
            limit + chrono::TimeDelta::minutes(1),
            answer(404, problem(404, "not-found", "Not Found")),
            true,
        ),
    ] {
        let server = MockServer::start().await;
        let id = Uuid::new_v4();
        posts_answer(&server, paid(id), 0).await;
        look_ups(id).respond_with(body).mount(&server).await;
        let (journal, client, _) = journal_and_client(&server, fast_policy()).await;
        let intent = named_long_ago(&journal, &server, age, id).await;

        let err = client.pay(&intent).await.expect_err("not settled");

        let kept = journal.pending().await;
        assert_eq!(kept.len(), 1, "kept for a human");
        assert_eq!(kept[0].payment_id, Some(id), "with the id the server named");
        if lost {
            assert!(
                matches!(&err, PayError::Lost { payment_id, .. } if *payment_id == id),
                "{err:?}"
            );
            assert!(err.to_string().contains("check the gateway"), "{err}");
            assert!(kept[0].blocked.is_some(), "not retried without a human");
        } else {
            assert!(
                matches!(err, PayError::Rejected { status: 404, .. }),
                "{err:?}"
            );
        }
        server.verify().await;
    }
}

/// The limit holds for every resend, not only when the 404 is read: one inside it whose
/// resend is answered 503 with a `Retry-After` that ends past it is not posted again.
#[tokio::test]
async fn a_lost_payment_resent_near_the_limit_is_not_posted_again_past_it() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    posts()
        .respond_with(unavailable(503, "Unavailable").insert_header("Retry-After", "12"))
        .expect(1)
        .mount(&server)
        .await;
    look_ups(id)
        .respond_with(answer(404, problem(404, "not-found", "Not Found")))
        .mount(&server)
        .await;
    let policy = PayPolicy {
        deadline: Duration::from_secs(60),
        ..fast_policy()
    };
    let (journal, client, _) = journal_and_client(&server, policy).await;
    // Room for a loaded machine's journal writes before the 404 is read.
    let age = pagos_client::LOST_PAYMENT_RESEND - chrono::TimeDelta::seconds(10);
    let intent = named_long_ago(&journal, &server, age, id).await;

    let err = client.pay(&intent).await.expect_err("not settled");

    assert!(matches!(&err, PayError::Lost { .. }), "{err:?}");
    server.verify().await;
}

/// `intent()`, first sent `age` ago and named `id` by the server, as its journal keeps it.
async fn named_long_ago(
    journal: &TestJournal,
    server: &MockServer,
    age: chrono::TimeDelta,
    id: Uuid,
) -> Intent {
    let url = pagos_client::base_url(&server.uri()).expect("url");
    let intent = intent().first_sent_at(chrono::Utc::now() - age);
    journal
        .journal
        .record(&intent, &url, API_KEY)
        .await
        .expect("kept");
    journal
        .journal
        .payment_known(intent.key(), id)
        .await
        .expect("named");
    intent
}

#[tokio::test]
async fn a_202_is_followed_by_looking_the_payment_up_until_it_settles() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    posts_answer(&server, answer(202, pago(id, "ENVIADA")), 1).await;
    look_ups(id)
        .respond_with(answer(200, pago(id, "ENVIADA")))
        .up_to_n_times(2)
        .with_priority(1)
        .mount(&server)
        .await;
    then(
        look_ups(id).respond_with(answer(200, pago(id, "COMPLETADA"))),
        &server,
    )
    .await;
    let (journal, client, notices) = journal_and_client(&server, fast_policy()).await;

    let outcome = client.pay(&intent()).await.expect("an outcome");

    assert!(matches!(outcome, Outcome::Paid(p) if p.id == id));
    let pending: Vec<_> = notices
        .all()
        .into_iter()
        .filter(|n| {
            matches!(
                n.waiting,
                Waiting::Pending {
                    state: PaymentState::Enviada,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(
        pending.len(),
        3,
        "after the 202 and after each ENVIADA look-up"
    );
    server.verify().await;
    assert!(journal.pending().await.is_empty());
}

#[tokio::test]
async fn a_payment_pending_at_the_deadline_is_kept_and_later_resumed_by_reading_it_not_posting() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    posts_answer(&server, answer(202, pago(id, "ENVIADA")), 1).await;
    let still = look_ups(id)
        .respond_with(answer(200, pago(id, "ENVIADA")))
        .mount_as_scoped(&server)
        .await;
    let policy = until(Duration::from_millis(600), Duration::from_millis(50));
    let (journal, client, _) = journal_and_client(&server, policy).await;
    let intent = intent();

    let outcome = client.pay(&intent).await.expect("an outcome");

    assert!(
        matches!(&outcome, Outcome::Pending(p) if p.id == id && p.state == PaymentState::Enviada)
    );
    let kept = journal.pending().await;
    assert_eq!(kept.len(), 1);
    assert_eq!(
        kept[0].payment_id,
        Some(id),
        "the payment's id is kept with the intent"
    );

    drop(still);
    look_ups(id)
        .respond_with(answer(200, pago(id, "COMPLETADA")))
        .mount(&server)
        .await;
    let resumed = client.resume().await.expect("resume");

    assert_eq!(resumed.len(), 1);
    assert!(matches!(&resumed[0].result, Ok(Outcome::Paid(p)) if p.id == id));
    assert_eq!(
        posts_seen(&server).await.len(),
        1,
        "resumed by GET, never a second POST"
    );
    assert!(journal.pending().await.is_empty());
    server.verify().await;
}

/// A payment the server already showed pending whose look-ups then end the budget: the
/// deadline comes while one is unanswered (the server is slow, or the look-up started with
/// little time left), or they fail (503) until `max_attempts`. The payment is pending as
/// far as anyone knows — never "gave up" (exit 1), which would tell the merchant something
/// failed.
#[tokio::test]
async fn look_ups_that_end_the_budget_leave_the_payment_pending_not_failed() {
    let id = Uuid::new_v4();
    for (look_up, policy) in [
        (
            answer(200, pago(id, "ENVIADA")).set_delay(Duration::from_secs(5)),
            until(Duration::from_millis(600), Duration::from_millis(50)),
        ),
        (
            unavailable(503, "Unavailable"),
            PayPolicy {
                max_attempts: 3,
                ..fast_policy()
            },
        ),
    ] {
        let server = MockServer::start().await;
        posts_answer(&server, answer(202, pago(id, "ENVIADA")), 1).await;
        look_ups(id).respond_with(look_up).mount(&server).await;
        let (journal, client, _) = journal_and_client(&server, policy).await;

        let outcome = client.pay(&intent()).await;

        assert!(
            matches!(&outcome, Ok(Outcome::Pending(p)) if p.id == id && p.state == PaymentState::Enviada),
            "{outcome:?}"
        );
        assert_eq!(journal.pending().await.len(), 1);
    }
}

/// The same, in the next run: the journal keeps the payment's id from a run that ended
/// pending, and this run's look-ups fail (503) until `max_attempts`. Still pending as far
/// as anyone knows (`Unread`, exit 4), with its id: not "gave up" (exit 1) after the first
/// run said pending. Nothing is posted again.
#[tokio::test]
async fn a_kept_payment_whose_look_ups_fail_in_the_next_run_is_unread_not_failed() {
    let id = Uuid::new_v4();
    let server = MockServer::start().await;
    posts_answer(&server, answer(202, pago(id, "ENVIADA")), 1).await;
    let still = look_ups(id)
        .respond_with(answer(200, pago(id, "ENVIADA")))
        .mount_as_scoped(&server)
        .await;
    let policy = PayPolicy {
        max_attempts: 3,
        ..fast_policy()
    };
    let (journal, client, _) = journal_and_client(&server, policy).await;
    let intent = intent();
    let first = client.pay(&intent).await;
    assert!(matches!(&first, Ok(Outcome::Pending(_))), "{first:?}");
    drop(still);
    look_ups(id)
        .respond_with(unavailable(503, "Unavailable"))
        .mount(&server)
        .await;

    let next = client.pay(&intent).await;

    assert!(
        matches!(&next, Err(PayError::Unread { payment_id, .. }) if *payment_id == id),
        "{next:?}"
    );
    assert_eq!(journal.pending().await.len(), 1, "kept for --resume");
    assert_eq!(posts_seen(&server).await.len(), 1, "never posted again");
}

#[tokio::test]
async fn a_decline_is_an_outcome_with_its_code_and_leaves_the_journal() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    let mut declined = problem(402, "payment-declined", "Payment declined");
    declined["declineCode"] = "insufficient_funds".into();
    declined["pago"] = pago(id, "FALLIDA");
    posts_answer(&server, answer(402, declined), 1).await;
    let (journal, client, _) = journal_and_client(&server, fast_policy()).await;

    let outcome = client.pay(&intent()).await.expect("an outcome");

    match outcome {
        Outcome::Declined { payment, problem } => {
            assert_eq!(payment.state, PaymentState::Fallida);
            let code = problem.and_then(|p| p.extensions.get("declineCode").cloned());
            assert_eq!(code, Some("insufficient_funds".into()));
        }
        other => panic!("not declined: {other:?}"),
    }
    assert!(journal.pending().await.is_empty());
}

#[tokio::test]
async fn an_intent_recorded_by_a_process_that_died_is_resumed_with_its_key_by_the_next_one() {
    let server = MockServer::start().await;
    posts_answer(&server, paid(Uuid::new_v4()), 1).await;
    let journal = TestJournal::new().await;
    let url = pagos_client::base_url(&server.uri()).expect("url");
    // The first process wrote the intent down, counted its request, and died.
    let intent = intent();
    journal.record_sent_once(&intent, &url).await;
    // Another merchant's intent at the same server is not this key's to resume.
    let theirs = Intent::new(PaymentRequest::new("7", 100, "USD").expect("valid"));
    journal
        .journal
        .record(&theirs, &url, "sk_test_globex")
        .await
        .expect("recorded");

    let reopened = pagos_client::Journal::open(&journal.path)
        .await
        .expect("journal");
    let client = Client::new(&server.uri(), API_KEY)
        .expect("client")
        .with_policy(fast_policy())
        .with_journal(reopened);
    let resumed = client.resume().await.expect("resume");

    assert_eq!(resumed.len(), 1);
    assert!(matches!(resumed[0].result, Ok(Outcome::Paid(_))));
    let keys: Vec<_> = keys_sent(&server).await;
    assert_eq!(keys, [intent.key().as_str()]);
    let left = journal.pending().await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].intent, theirs);
}

#[tokio::test]
async fn an_answer_about_another_payment_is_not_taken_as_this_ones() {
    let server = MockServer::start().await;
    let mut other = pago(Uuid::new_v4(), "COMPLETADA");
    other["monto"] = 1.into();
    posts_answer(&server, answer(201, other), 1).await;
    let (journal, client, _) = journal_and_client(&server, fast_policy()).await;

    let err = client.pay(&intent()).await.expect_err("not ours");

    assert!(matches!(err, PayError::Unexpected(_)), "{err:?}");
    assert_eq!(journal.pending().await.len(), 1);
}

#[tokio::test]
async fn an_unanswered_intent_older_than_the_servers_key_retention_is_not_sent_again() {
    let server = MockServer::start().await;
    posts_answer(&server, paid(Uuid::new_v4()), 0).await;
    let journal = TestJournal::new().await;
    let url = pagos_client::base_url(&server.uri()).expect("url");
    let intent = intent();
    journal.record_sent_once(&intent, &url).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (client, _) = client(&server, &journal.journal, fast_policy());
    let client = client.with_key_retention(Duration::from_millis(10));

    let err = client.pay(&intent).await.expect_err("expired");

    assert!(
        matches!(&err, PayError::Expired { key, .. } if key == intent.key()),
        "{err:?}"
    );
    assert!(err.to_string().contains("could pay twice"), "{err}");
    assert_eq!(journal.pending().await.len(), 1, "kept for a human");
    server.verify().await;
}

/// The same payment, and the same refund, asked from several processes at once (a form
/// sent twice, a job run twice), each with its own handle on one journal file: all of them
/// get one intent, so they pay (refund) under one key, never a second payment under a key
/// of its own.
#[tokio::test]
async fn the_same_payment_or_refund_asked_at_once_by_several_processes_gets_one_key() {
    let server = MockServer::start().await;
    let journal = TestJournal::new().await;
    let payment = Uuid::new_v4();
    let mut asks = Vec::new();
    for _ in 0..8 {
        let handle = Journal::open(&journal.path).await.expect("journal");
        let (client, _) = client(&server, &handle, fast_policy());
        asks.push(tokio::spawn(async move {
            let intent = client
                .intent_for(intent().request().clone())
                .await
                .expect("intent");
            let refund = RefundRequest::new(payment, Some(50_000), None).expect("valid");
            let refund = client.refund_intent_for(refund).await.expect("intent");
            (intent.key().to_string(), refund.key().to_string())
        }));
    }
    let mut keys = std::collections::BTreeSet::new();
    let mut refund_keys = std::collections::BTreeSet::new();
    for ask in asks {
        let (key, refund_key) = ask.await.expect("joined");
        keys.insert(key);
        refund_keys.insert(refund_key);
    }

    assert_eq!(keys.len(), 1, "payment keys: {keys:?}");
    assert_eq!(refund_keys.len(), 1, "refund keys: {refund_keys:?}");
    assert_eq!(journal.pending().await.len(), 1, "one payment intent kept");
}

/// The same payment and refund kept under an API key rotated since: it may have paid
/// (refunded) already, and the same merchant's new key would get the same payment from
/// its key. Before, `intent_for` and `refund_intent_for` made a new intent beside it: a
/// second payment, a second refund. Now they refuse, naming the kept intent, and make
/// none, as `pagos pay` refuses.
#[tokio::test]
async fn an_intent_kept_under_a_rotated_api_key_is_never_asked_again_under_a_new_key() {
    let server = MockServer::start().await;
    let (journal, client, _) = journal_and_client(&server, fast_policy()).await;
    let url = pagos_client::base_url(&server.uri()).expect("url");
    let payment = Uuid::new_v4();
    let old = intent();
    journal
        .journal
        .record(&old, &url, "sk_test_rotated")
        .await
        .expect("kept");
    let old_refund =
        RefundIntent::new(RefundRequest::new(payment, Some(50_000), None).expect("valid"));
    journal
        .journal
        .record_refund(&old_refund, &url, "sk_test_rotated")
        .await
        .expect("kept");

    let asked = client.intent_for(intent().request().clone()).await;
    let refund = RefundRequest::new(payment, Some(50_000), None).expect("valid");
    let refund_asked = client.refund_intent_for(refund).await;

    for (asked, kept) in [
        (asked.map(|i| i.key().clone()), old.key()),
        (refund_asked.map(|i| i.key().clone()), old_refund.key()),
    ] {
        match asked {
            Err(PayError::KeptElsewhere {
                key, same_api_key, ..
            }) => {
                assert_eq!(&key, kept, "names the kept intent");
                assert!(!same_api_key);
            }
            other => panic!("not refused: {other:?}"),
        }
    }
    assert_eq!(journal.pending().await.len(), 1, "no new payment intent");
    assert!(nothing_sent(&server).await, "nothing sent");
}

/// Two merchants' clients share one journal file, and each pays an intent made with the
/// same caller-chosen key for the same request (`Intent::with_key`). Before, the second
/// took the first's row for its own: it looked the first merchant's payment up with its
/// own API key, was answered 404, read that as a payment the server lost, and posted the
/// intent again. Now its `pay` is refused, naming where the kept intent was made, and
/// nothing is sent; the other merchant's intent stays kept.
#[tokio::test]
async fn an_intent_kept_for_another_api_key_under_the_same_key_is_refused_not_paid() {
    let server = MockServer::start().await;
    let (journal, client, _) = journal_and_client(&server, fast_policy()).await;
    let url = pagos_client::base_url(&server.uri()).expect("url");
    let mine = intent();
    let theirs = Intent::with_key(mine.key().clone(), mine.request().clone());
    journal
        .journal
        .record(&theirs, &url, "sk_test_globex")
        .await
        .expect("kept");
    journal
        .journal
        .payment_known(theirs.key(), Uuid::new_v4())
        .await
        .expect("named");

    match client.pay(&mine).await {
        Err(PayError::KeptElsewhere {
            key, same_api_key, ..
        }) => {
            assert_eq!(&key, mine.key(), "names the kept intent");
            assert!(!same_api_key);
        }
        other => panic!("not refused: {other:?}"),
    }
    assert!(nothing_sent(&server).await, "nothing sent");
    assert_eq!(journal.pending().await.len(), 1, "the other's intent kept");
}

/// A resume pays from the list it read first. An intent sent long ago that another
/// process settled or forgot meanwhile (its row gone: a resume beside it, or on-call's
/// `--forget` after finding its payment) is still that old intent: never recorded again as
/// never sent and posted with a key the server may have let go, a second payment.
#[tokio::test]
async fn an_old_intent_that_left_the_journal_while_a_resume_ran_is_not_sent_again() {
    let server = MockServer::start().await;
    posts_answer(&server, paid(Uuid::new_v4()), 0).await;
    let (journal, client, _) = journal_and_client(&server, fast_policy()).await;
    let url = pagos_client::base_url(&server.uri()).expect("url");
    journal.record_sent_once(&intent(), &url).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    let listed = journal.pending().await;
    assert_eq!(listed.len(), 1);
    assert!(
        journal
            .journal
            .remove(listed[0].intent.key())
            .await
            .expect("forgot")
    );
    let client = client.with_key_retention(Duration::from_millis(20));

    let err = client.pay(&listed[0].intent).await.expect_err("expired");

    assert!(
        matches!(&err, PayError::Expired { key, .. } if key == listed[0].intent.key()),
        "{err:?}"
    );
    server.verify().await;
}

/// The server's answers leave the outcome unknown for longer than it keeps keys (a
/// retry budget longer than its retention): once the intent's first request is that old,
/// the server may have let the key go, and the same key would make a second payment. No
/// `POST` leaves after that; the pay ends `Expired` and the intent stays for a human.
#[tokio::test]
async fn no_retry_is_posted_once_the_first_request_is_as_old_as_the_key_retention() {
    /// 503 to every request, noting when it came.
    struct Busy(std::sync::Arc<std::sync::Mutex<Vec<Instant>>>);
    impl wiremock::Respond for Busy {
        fn respond(&self, _: &wiremock::Request) -> wiremock::ResponseTemplate {
            self.0.lock().expect("lock").push(Instant::now());
            unavailable(503, "Unavailable")
        }
    }
    let retention = Duration::from_millis(800);
    let policy = PayPolicy {
        max_attempts: 1000,
        deadline: Duration::from_secs(4),
        min_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(100),
        ..fast_policy()
    };
    let server = MockServer::start().await;
    let (journal, with_journal, _) = journal_and_client(&server, policy).await;
    let without_journal = Client::new(&server.uri(), API_KEY)
        .expect("client")
        .with_policy(policy);
    for client in [with_journal, without_journal] {
        server.reset().await;
        let times = std::sync::Arc::default();
        posts()
            .respond_with(Busy(std::sync::Arc::clone(&times)))
            .mount(&server)
            .await;
        let client = client.with_key_retention(retention);
        let intent = intent();
        let began = Instant::now();

        let result = client.pay(&intent).await;

        let times = times.lock().expect("lock").clone();
        assert!(times.len() > 1, "retried: {}", times.len());
        let last = times.last().expect("sent").duration_since(began);
        assert!(
            last < retention,
            "a POST left {last:?} after the first, past the key retention {retention:?}"
        );
        assert!(
            matches!(&result, Err(PayError::Expired { key, .. }) if key == intent.key()),
            "{result:?}"
        );
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "ended at the retention"
        );
    }
    let kept = journal.pending().await;
    assert_eq!(kept.len(), 1, "kept for a human");
    assert!(
        kept[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("not sent again")),
        "{:?}",
        kept[0].last_error
    );
}

#[tokio::test]
async fn a_refund_of_a_payment_that_is_not_refundable_is_refused_at_once_not_retried() {
    let server = MockServer::start().await;
    let payment = Uuid::new_v4();
    wiremock::Mock::given(wiremock::matchers::method("POST"))
        .and(wiremock::matchers::path(format!(
            "/v1/pagos/{payment}/reembolsos"
        )))
        .respond_with(answer(
            409,
            problem(
                409,
                "payment-not-refundable",
                "The payment cannot be refunded",
            ),
        ))
        .expect(1)
        .mount(&server)
        .await;
    let (_journal, client, _) = journal_and_client(&server, fast_policy()).await;
    let request = RefundRequest::new(payment, None, None).expect("valid");
    let intent = RefundIntent::new(request.clone());

    let err = client.refund(&intent).await.expect_err("refused");

    match &err {
        PayError::Rejected { status, problem } => {
            assert_eq!(*status, 409);
            assert_eq!(problem.kind(), Some(ProblemType::PaymentNotRefundable));
        }
        other => panic!("not a refusal: {other:?}"),
    }
    server.verify().await;
    assert_eq!(
        client.kept_refund(&request).await.expect("journal"),
        None,
        "refused on its first request: nothing was registered, the intent leaves the journal"
    );
}

/// A refund's request timed out in one process, which kept its intent. Another process
/// asks the same refund again, and its first request is refused (a 401: the API key was
/// just revoked; or a proxy's 403). The earlier request may have made the refund, so the
/// intent is kept: the next run asks it again with its key instead of making a new one.
#[tokio::test]
async fn a_refusal_after_another_process_sent_the_refund_keeps_the_intent_and_its_key() {
    let server = MockServer::start().await;
    let payment = Uuid::new_v4();
    let refunds = || {
        wiremock::Mock::given(wiremock::matchers::method("POST")).and(wiremock::matchers::path(
            format!("/v1/pagos/{payment}/reembolsos"),
        ))
    };
    first(
        refunds().respond_with(unavailable(503, "Unavailable")),
        &server,
    )
    .await;
    then(
        refunds().respond_with(answer(401, problem(401, "unauthorized", "Unauthorized"))),
        &server,
    )
    .await;
    let journal = TestJournal::new().await;
    let once = PayPolicy {
        max_attempts: 1,
        ..fast_policy()
    };
    let (timed_out, _) = client(&server, &journal.journal, once);
    let request = RefundRequest::new(payment, Some(1_000), None).expect("valid");
    let intent = RefundIntent::new(request.clone());
    let err = timed_out.refund(&intent).await.expect_err("gave up");
    assert!(matches!(err, PayError::GaveUp { .. }), "{err:?}");

    // Another process, with the same journal file.
    let reopened = pagos_client::Journal::open(&journal.path)
        .await
        .expect("journal");
    let (other, _) = client(&server, &reopened, once);
    let kept = other.kept_refund(&request).await.expect("journal");
    assert_eq!(kept.as_ref(), Some(&intent));
    let err = other.refund(&intent).await.expect_err("refused");
    assert!(
        matches!(err, PayError::Rejected { status: 401, .. }),
        "{err:?}"
    );

    assert_eq!(
        other.kept_refund(&request).await.expect("journal"),
        Some(intent.clone()),
        "the first request may have made the refund: its intent and key are kept"
    );
}

#[tokio::test]
async fn a_409_that_is_not_the_first_request_in_flight_is_a_refusal_of_the_payment() {
    let server = MockServer::start().await;
    posts_answer(
        &server,
        answer(409, problem(409, "conflict", "Conflict")),
        1,
    )
    .await;
    let (journal, client, notices) = journal_and_client(&server, fast_policy()).await;

    let err = client.pay(&intent()).await.expect_err("refused");

    assert!(
        matches!(&err, PayError::Rejected { status: 409, problem } if problem.title == "Conflict"),
        "{err:?}"
    );
    assert!(notices.all().is_empty(), "a refusal is not retried");
    server.verify().await;
    assert!(journal.pending().await.is_empty());
}

/// The first request outlives its timeout while the server works on it: every retry gets
/// 409 `request-in-flight` until the server answers. Those 409s are a known state, not
/// failures: they wait out `Retry-After` within the deadline and use up no attempts, so
/// the client learns the server's answer (here 202, pending) instead of giving up.
#[tokio::test]
async fn a_409_while_the_first_request_runs_uses_up_no_attempts() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    posts()
        .respond_with(answer(202, pago(id, "ENVIADA")).set_delay(Duration::from_secs(3)))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&server)
        .await;
    let in_flight = problem(
        409,
        "request-in-flight",
        "A request with this Idempotency-Key is in progress",
    );
    posts()
        .respond_with(answer(409, in_flight).insert_header("Retry-After", "1"))
        .up_to_n_times(12)
        .with_priority(2)
        .mount(&server)
        .await;
    posts()
        .respond_with(answer(202, pago(id, "ENVIADA")))
        .with_priority(3)
        .mount(&server)
        .await;
    look_ups(id)
        .respond_with(answer(200, pago(id, "ENVIADA")))
        .mount(&server)
        .await;
    let policy = PayPolicy {
        max_attempts: 10,
        deadline: Duration::from_secs(16),
        request_timeout: Duration::from_millis(300),
        ..fast_policy()
    };
    let (journal, client, notices) = journal_and_client(&server, policy).await;
    let intent = intent();

    let outcome = client.pay(&intent).await;

    assert!(
        matches!(&outcome, Ok(Outcome::Pending(p)) if p.id == id),
        "{outcome:?}"
    );
    let keys = keys_sent(&server).await;
    assert_eq!(keys.len(), 14, "the first request, twelve 409s, the 202");
    assert!(keys.iter().all(|k| k == intent.key().as_str()));
    let waits: Vec<_> = notices
        .all()
        .into_iter()
        .filter(|n| matches!(&n.waiting, Waiting::Failed { why, .. } if why.starts_with("409")))
        .collect();
    assert_eq!(waits.len(), 12);
    assert!(waits.iter().all(|n| n.wait >= Duration::from_secs(1)));
    assert_eq!(journal.pending().await[0].payment_id, Some(id));
}

#[tokio::test]
async fn a_retry_after_longer_than_the_deadline_ends_the_pay_at_once_with_the_intent_kept() {
    let server = MockServer::start().await;
    posts_answer(
        &server,
        unavailable(503, "Unavailable").insert_header("Retry-After", "18446744073709551615"),
        1,
    )
    .await;
    let (journal, client, notices) = journal_and_client(&server, fast_policy()).await;

    let err = client.pay(&intent()).await.expect_err("gave up");

    assert!(
        matches!(&err, PayError::GaveUp { attempts: 1, last, .. } if last.ends_with("(deadline reached)")),
        "{err:?}"
    );
    assert!(notices.all().is_empty(), "no wait was started");
    assert_eq!(journal.pending().await.len(), 1);
    server.verify().await;
}

#[tokio::test]
async fn the_journal_gives_back_a_pending_payment_asked_again_only_to_its_server_and_api_key() {
    let server = MockServer::start().await;
    let journal = TestJournal::new().await;
    let url = pagos_client::base_url(&server.uri()).expect("url");
    let intent = intent();
    journal.record_sent_once(&intent, &url).await;
    let (client, _) = client(&server, &journal.journal, fast_policy());

    let kept = client
        .kept_payment(intent.request())
        .await
        .expect("journal");

    assert_eq!(kept.map(|k| k.intent), Some(intent.clone()));
    let other_body = PaymentRequest::new("42", 1, "COP").expect("valid");
    assert_eq!(
        client.kept_payment(&other_body).await.expect("journal"),
        None
    );
    let other_key = Client::new(&server.uri(), "sk_test_globex")
        .expect("client")
        .with_journal(journal.journal.clone());
    assert_eq!(
        other_key
            .kept_payment(intent.request())
            .await
            .expect("journal"),
        None
    );
    let no_journal = Client::new(&server.uri(), API_KEY).expect("client");
    assert_eq!(
        no_journal.kept_payment(intent.request()).await.expect("ok"),
        None
    );
}

/// A merchant kept the key (and when it first sent it) next to its order, and retries a
/// day and more later: the server may have let the key go, and the same key would make a
/// new payment. Nothing is sent; with a journal, the intent is kept there for a human.
#[tokio::test]
async fn a_kept_key_first_sent_longer_ago_than_the_key_retention_is_not_sent_again() {
    let server = MockServer::start().await;
    posts_answer(&server, paid(Uuid::new_v4()), 0).await;
    let sent = chrono::Utc::now() - chrono::Duration::hours(25);
    let kept = pagos_client::IntentKey::parse("pedido-7731-pago").expect("key");
    let retry = Intent::with_key(kept, intent().request().clone()).first_sent_at(sent);
    let without_journal = Client::new(&server.uri(), API_KEY)
        .expect("client")
        .with_policy(fast_policy());
    let (journal, with_journal, _) = journal_and_client(&server, fast_policy()).await;

    for client in [&without_journal, &with_journal] {
        let err = client.pay(&retry).await.expect_err("expired");

        assert!(
            matches!(&err, PayError::Expired { key, first_sent, .. } if key == retry.key() && *first_sent == sent),
            "{err:?}"
        );
    }
    let kept = journal.pending().await;
    assert_eq!(kept.len(), 1, "kept for a human");
    assert_eq!(kept[0].attempts, 1, "it was sent before");
    let resumed = with_journal.resume().await.expect("resume");
    assert!(matches!(resumed[0].result, Err(PayError::Expired { .. })));
    server.verify().await;
}

/// The flags of `intent()`'s payment on `pagos pay`'s command line.
const PAYMENT: [&str; 6] = ["--credito", "42", "--monto", "250000", "--moneda", "COP"];

/// Runs `run_b` (a second run of one intent, whose first request is answered 409 in
/// flight) while run A, once B's first request is heard, gets its answer and lets the
/// intent go (`let_go`, which says whether it was kept): B's exit code.
async fn while_another_run_lets_it_go(
    run_b: impl std::future::Future<Output = ExitCode>,
    mut heard: futures::channel::mpsc::UnboundedReceiver<()>,
    let_go: impl std::future::Future<Output = bool>,
) -> ExitCode {
    let run_a_settles = async {
        heard.next().await.expect("B's first request");
        assert!(let_go.await, "A let it go while B waited");
    };
    let (exit, ()) = tokio::join!(run_b, run_a_settles);
    exit
}

/// A refund of 1,000 of `payment` written down in `journal` for `server`, as run A left
/// it (`sent`: its request counted); the request and the intent.
async fn refund_recorded(
    journal: &TestJournal,
    server: &MockServer,
    payment: Uuid,
    sent: bool,
) -> (RefundRequest, RefundIntent) {
    let url = pagos_client::base_url(&server.uri()).expect("url");
    let request = RefundRequest::new(payment, Some(1_000), None).expect("valid");
    let intent = RefundIntent::new(request.clone());
    journal
        .journal
        .record_refund(&intent, &url, API_KEY)
        .await
        .expect("recorded");
    if sent {
        journal
            .journal
            .count_refund_attempt(intent.key())
            .await
            .expect("counted");
    }
    (request, intent)
}

/// The keys of every request `server` received.
async fn every_key_sent(server: &MockServer) -> Vec<String> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .iter()
        .map(key_of)
        .collect()
}

/// The same payment run twice at once (a job started twice, the command in two
/// terminals): run A's request is in flight when run B sends the same intent, answered 409
/// `request-in-flight`, `Retry-After: 1`. While B waits, A gets its 201 and lets the intent
/// go. Before, B's retry found no row to count, took the journal for damaged ("journal
/// entry K is unreadable") and exited 1 with nothing left pending: run again, it paid
/// under a new key, charging the customer twice. Now B sends the same key uncounted, the
/// server replays A's 201, and B exits 0: one key, nothing written back.
#[tokio::test]
async fn a_payment_settled_by_another_run_while_this_one_waits_is_paid_with_its_key() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    let (in_flight, heard) = tell(in_flight());
    first(posts().respond_with(in_flight), &server).await;
    then(posts().respond_with(paid_replay(id)), &server).await;
    let journal = TestJournal::new().await;
    let url = pagos_client::base_url(&server.uri()).expect("url");
    // Run A wrote the intent down and sent it; its request still runs on the server.
    let intent = intent();
    journal.record_sent_once(&intent, &url).await;

    // A's 201 comes while B waits: it lets the intent go, as `pay` does.
    let exit =
        while_another_run_lets_it_go(pagos_pay(&server, &journal.path, &PAYMENT), heard, async {
            journal.journal.remove(intent.key()).await.expect("journal")
        })
        .await;

    assert_eq!(exit, ExitCode::from(0), "B reports the payment");
    let key = intent.key().as_str();
    assert_eq!(
        keys_sent(&server).await,
        [key, key],
        "one key, never a new one"
    );
    assert!(journal.pending().await.is_empty(), "nothing written back");
}

/// The same for a refund: `pagos refund` run twice at once, the first run's refund
/// settled (and let go) while the second waits out a 409: the second exits 0 with the
/// refund, its key the only one sent.
#[tokio::test]
async fn a_refund_settled_by_another_run_while_this_one_waits_is_refunded_with_its_key() {
    let server = MockServer::start().await;
    let payment = Uuid::new_v4();
    let (in_flight, heard) = tell(in_flight());
    first(refunds(payment).respond_with(in_flight), &server).await;
    let refunded = answer(201, reembolso(Uuid::new_v4(), payment, "COMPLETADO"))
        .insert_header("Idempotent-Replayed", "true");
    then(refunds(payment).respond_with(refunded), &server).await;
    let journal = TestJournal::new().await;
    let (request, intent) = refund_recorded(&journal, &server, payment, true).await;

    let payment_id = payment.to_string();
    let flags = ["--pago", &payment_id, "--monto", "1000"];
    let exit =
        while_another_run_lets_it_go(pagos_refund(&server, &journal.path, &flags), heard, async {
            let removed = journal.journal.remove_refund(intent.key()).await;
            removed.expect("journal")
        })
        .await;

    assert_eq!(exit, ExitCode::from(0), "B reports the refund");
    assert_eq!(
        every_key_sent(&server).await,
        [intent.key().to_string(), intent.key().to_string()]
    );
    let kept = journal
        .journal
        .find_refunds(&request)
        .await
        .expect("journal");
    assert!(kept.is_empty(), "nothing written back: {kept:?}");
}

/// The intent leaves the journal while its first request is in flight (on-call's
/// `--forget`, or another process's answer), and that request is answered 202. Before,
/// writing the payment's id down found no row and the pay ended with a journal error
/// (exit 1, nothing pending: asked again, a new key). Now the payment is read by its id
/// all the same, and its outcome told.
#[tokio::test]
async fn a_payment_named_after_its_intent_left_the_journal_is_read_and_told() {
    let server = MockServer::start().await;
    let id = Uuid::new_v4();
    let (named, mut heard) =
        tell(answer(202, pago(id, "ENVIADA")).set_delay(Duration::from_millis(500)));
    posts().respond_with(named).expect(1).mount(&server).await;
    look_ups(id)
        .respond_with(answer(200, pago(id, "COMPLETADA")))
        .mount(&server)
        .await;
    let (journal, client, _) = journal_and_client(&server, fast_policy()).await;
    let intent = intent();

    let paying = client.pay(&intent);
    let forgotten = async {
        heard.next().await.expect("the request");
        let removed = journal.journal.remove(intent.key()).await.expect("journal");
        assert!(removed, "forgotten while its request ran");
    };
    let (outcome, ()) = tokio::join!(paying, forgotten);

    assert!(
        matches!(&outcome, Ok(Outcome::Paid(p)) if p.id == id),
        "{outcome:?}"
    );
    assert!(journal.pending().await.is_empty(), "nothing written back");
    server.verify().await;
}

/// Without a journal the caller keeps the `Intent` value itself and pays it again later
/// (a retry job the next day). Its first request left longer ago than the server keeps
/// keys, so the same key could make a second payment. Before, the later `pay` counted the
/// key's age from its own start and sent it; now the intent, and every clone of it,
/// remembers its first send, and the later `pay` is refused `Expired` with nothing sent.
#[tokio::test]
async fn the_same_intent_paid_again_past_the_key_retention_without_a_journal_is_not_sent() {
    let server = MockServer::start().await;
    posts_answer(&server, unavailable(503, "Unavailable"), 1).await;
    let retention = Duration::from_millis(500);
    let client = Client::new(&server.uri(), API_KEY)
        .expect("client")
        .with_policy(PayPolicy {
            max_attempts: 1,
            ..fast_policy()
        })
        .with_key_retention(retention);
    let intent = intent();
    let before = chrono::Utc::now();
    let first = client.pay(&intent).await;
    let after = chrono::Utc::now();
    assert!(matches!(first, Err(PayError::GaveUp { .. })), "{first:?}");
    tokio::time::sleep(retention).await;

    let err = client.pay(&intent.clone()).await.expect_err("expired");

    assert!(
        matches!(&err, PayError::Expired { key, first_sent, .. }
            if key == intent.key() && *first_sent >= before && *first_sent <= after),
        "{err:?}"
    );
    server.verify().await;
}

/// The server URL answers the first request with a redirect (a load balancer sending
/// `http://` to `https://`, or a proxy answering its own timeout with a redirect to an
/// error page after it forwarded the request). pagos never redirects, but whether the
/// request reached it is not known: the intent is kept, and the error names where the
/// redirect leads. Before, a redirect was an unexpected answer and named nothing. Once
/// the payment is known not to exist, the intent let go, the client at that URL pays.
/// The same for a refund.
#[tokio::test]
async fn a_redirect_keeps_the_intent_and_names_where_it_leads() {
    let old = MockServer::start().await;
    let new = MockServer::start().await;
    let (id, payment) = (Uuid::new_v4(), Uuid::new_v4());
    let pay_path = "/v1/pagos".to_owned();
    let refund_path = format!("/v1/pagos/{payment}/reembolsos");
    let moved = |path: &str| {
        ResponseTemplate::new(301).insert_header("Location", format!("{}{path}", new.uri()))
    };
    posts_answer(&old, moved(&pay_path), 1).await;
    refunds(payment)
        .respond_with(moved(&refund_path))
        .expect(1)
        .mount(&old)
        .await;
    posts_answer(&new, paid(id), 1).await;
    let journal = TestJournal::new().await;
    let (at_old, _) = client(&old, &journal.journal, fast_policy());
    let (at_new, _) = client(&new, &journal.journal, fast_policy());
    let request = intent().request().clone();
    let refund = RefundRequest::new(payment, Some(1_000), None).expect("valid");

    let intent = at_old.intent_for(request.clone()).await.expect("intent");
    let paid_err = at_old.pay(&intent).await.expect_err("redirected");
    let refund_intent = at_old
        .refund_intent_for(refund.clone())
        .await
        .expect("intent");
    let refund_err = at_old.refund(&refund_intent).await.expect_err("redirected");

    for (err, path) in [(paid_err, pay_path), (refund_err, refund_path)] {
        let to = format!("{}{path}", new.uri());
        assert!(
            matches!(&err, PayError::Redirected { status: 301, location: Some(l) } if *l == to),
            "{err:?}"
        );
        assert!(err.to_string().contains(&to), "{err}");
    }
    let kept = journal.pending().await;
    assert_eq!(kept.len(), 1, "it may have reached pagos: kept");
    assert_eq!(kept[0].intent, intent);
    let kept_refunds = journal
        .journal
        .find_refunds(&refund)
        .await
        .expect("journal");
    assert_eq!(kept_refunds.len(), 1, "{kept_refunds:?}");

    // On-call found no such payment: let go, it is paid at the URL pagos answers at.
    assert!(journal.journal.remove(intent.key()).await.expect("journal"));
    let corrected = at_new.intent_for(request).await.expect("intent");
    let paid = at_new.pay(&corrected).await;
    assert!(
        matches!(&paid, Ok(Outcome::Paid(p)) if p.id == id),
        "{paid:?}"
    );
    old.verify().await;
    new.verify().await;
}

/// The same on the command line: `pagos pay --url http://…` redirected exits 1 keeping
/// the intent; the command at the new URL is refused (the intent was made at the old
/// one) until the intent is let go with `--forget`, and then pays.
#[tokio::test]
async fn pagos_pay_redirected_keeps_the_intent_until_it_is_forgotten() {
    let old = MockServer::start().await;
    let new = MockServer::start().await;
    let moved = ResponseTemplate::new(301).insert_header("Location", new.uri());
    posts_answer(&old, moved, 1).await;
    posts_answer(&new, paid(Uuid::new_v4()), 1).await;
    let journal = TestJournal::new().await;

    let redirected = pagos_pay(&old, &journal.path, &PAYMENT).await;
    assert_eq!(redirected, ExitCode::from(1));
    let kept = journal.pending().await;
    assert_eq!(kept.len(), 1, "the request may have reached pagos");
    let key = kept[0].intent.key().to_string();
    assert_eq!(
        pagos_pay(&new, &journal.path, &PAYMENT).await,
        ExitCode::from(1),
        "kept at the old URL"
    );
    assert_eq!(
        pagos_pay(&new, &journal.path, &["--forget", &key]).await,
        ExitCode::from(0)
    );
    let corrected = pagos_pay(&new, &journal.path, &PAYMENT).await;

    assert_eq!(corrected, ExitCode::from(0), "paid at the corrected URL");
    assert!(journal.pending().await.is_empty());
    old.verify().await;
    new.verify().await;
}

/// A payment (or refund) under review: the server answers 202 REVISION_MANUAL with
/// `Retry-After: 300` (on-call decides; nothing changes sooner). Before, the client looked
/// it up again every few hundred milliseconds until its deadline (a dozen requests in the
/// two minutes of `pagos pay`). Now the next look would be past the deadline, so the pay
/// ends at once, after its one request, pending, as at any deadline.
#[tokio::test]
async fn a_202_whose_retry_after_is_past_the_deadline_ends_at_once_pending() {
    let server = MockServer::start().await;
    let (id, payment) = (Uuid::new_v4(), Uuid::new_v4());
    let later = |body| answer(202, body).insert_header("Retry-After", "300");
    posts_answer(&server, later(pago(id, "REVISION_MANUAL")), 1).await;
    look_ups(id)
        .respond_with(answer(200, pago(id, "REVISION_MANUAL")))
        .expect(0)
        .mount(&server)
        .await;
    refunds(payment)
        .respond_with(later(reembolso(Uuid::new_v4(), payment, "REVISION_MANUAL")))
        .expect(1)
        .mount(&server)
        .await;
    let (journal, client, notices) = journal_and_client(&server, fast_policy()).await;
    let refund = RefundIntent::new(RefundRequest::new(payment, Some(1_000), None).expect("valid"));

    let started = Instant::now();
    let outcome = client.pay(&intent()).await;
    let refunded = client.refund(&refund).await;
    let took = started.elapsed();

    assert!(
        matches!(&outcome, Ok(Outcome::Pending(p)) if p.id == id && p.state == PaymentState::RevisionManual),
        "{outcome:?}"
    );
    assert!(
        matches!(&refunded, Ok(RefundOutcome::Pending(r)) if r.state == RefundState::RevisionManual),
        "{refunded:?}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(notices.all().is_empty(), "no wait was started");
    assert_eq!(
        journal.pending().await[0].payment_id,
        Some(id),
        "kept, with its id"
    );
    server.verify().await;
}

/// As above, but B's uncounted retry gets no answer either (503, and B's one attempt is
/// used up): B exits 1, the outcome unknown to it. Left out of the journal, the command
/// run again would pay under a new key; B writes the intent back with its key, so the run
/// again resumes it and the server replays A's answer.
#[tokio::test]
async fn a_payment_let_go_by_another_run_is_written_back_when_this_run_learns_nothing() {
    let server = MockServer::start().await;
    let (in_flight, heard) = tell(in_flight());
    first(posts().respond_with(in_flight), &server).await;
    then(
        posts().respond_with(unavailable(503, "Unavailable")),
        &server,
    )
    .await;
    let journal = TestJournal::new().await;
    let url = pagos_client::base_url(&server.uri()).expect("url");
    let intent = intent();
    journal.record_sent_once(&intent, &url).await;
    let flags = [&PAYMENT[..], &["--max-attempts", "1"]].concat();

    let exit =
        while_another_run_lets_it_go(pagos_pay(&server, &journal.path, &flags), heard, async {
            journal.journal.remove(intent.key()).await.expect("journal")
        })
        .await;
    assert_eq!(exit, ExitCode::from(1), "B gave up");
    let kept = journal.pending().await;
    assert_eq!(kept.len(), 1, "written back");
    assert_eq!(kept[0].intent, intent);
    assert!(kept[0].attempts > 0, "as sent: {}", kept[0].attempts);

    server.reset().await;
    posts_answer(&server, paid_replay(Uuid::new_v4()), 1).await;
    let again = pagos_pay(&server, &journal.path, &PAYMENT).await;

    assert_eq!(again, ExitCode::from(0));
    assert_eq!(keys_sent(&server).await, [intent.key().as_str()]);
    assert!(journal.pending().await.is_empty());
}

/// The same for a refund: written back with its key, and asked again with it.
#[tokio::test]
async fn a_refund_let_go_by_another_run_is_written_back_when_this_run_learns_nothing() {
    let server = MockServer::start().await;
    let payment = Uuid::new_v4();
    let (in_flight, heard) = tell(in_flight());
    first(refunds(payment).respond_with(in_flight), &server).await;
    then(
        refunds(payment).respond_with(unavailable(503, "Unavailable")),
        &server,
    )
    .await;
    let journal = TestJournal::new().await;
    let (request, intent) = refund_recorded(&journal, &server, payment, false).await;
    let payment_id = payment.to_string();
    let flags = ["--pago", &payment_id, "--monto", "1000"];
    let once = [&flags[..], &["--max-attempts", "1"]].concat();

    let exit =
        while_another_run_lets_it_go(pagos_refund(&server, &journal.path, &once), heard, async {
            let removed = journal.journal.remove_refund(intent.key()).await;
            removed.expect("journal")
        })
        .await;
    assert_eq!(exit, ExitCode::from(1), "B gave up");
    let kept = journal
        .journal
        .find_refunds(&request)
        .await
        .expect("journal");
    assert_eq!(kept.len(), 1, "written back");
    assert_eq!(kept[0].intent, intent);
    assert!(kept[0].attempts > 0, "as sent: {}", kept[0].attempts);

    server.reset().await;
    refunds(payment)
        .respond_with(answer(
            201,
            reembolso(Uuid::new_v4(), payment, "COMPLETADO"),
        ))
        .expect(1)
        .mount(&server)
        .await;
    let again = pagos_refund(&server, &journal.path, &flags).await;

    assert_eq!(again, ExitCode::from(0));
    assert_eq!(every_key_sent(&server).await, [intent.key().to_string()]);
}
