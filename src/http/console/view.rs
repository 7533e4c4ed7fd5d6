//! What the console's pages look like: the layout, and words for what the database holds
//! (states in words and colours, amounts in major units, ages as "12 min", times that the
//! browser shows in its own zone). Pure: no I/O, nothing but HTML out.

use crate::entities::payment::PaymentState;
use chrono::{DateTime, TimeDelta, Utc};
use maud::{DOCTYPE, Markup, html};

/// What the header shows of who is logged in.
pub struct Who<'a> {
    pub name: &'a str,
    pub role: &'a str,
    pub csrf: &'a str,
}

/// Every page: the header with the sections and the logout form, then `body`.
pub fn page(title: &str, who: Option<&Who<'_>>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · pagos" }
                link rel="stylesheet" href="/consola/static/consola.css";
                script src="/consola/static/hora.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/consola/" { "pagos" }
                    @if let Some(who) = who {
                        nav {
                            a href="/consola/" { "Attention" }
                            a href="/consola/pagos" { "Payments" }
                            a href="/consola/reconciliaciones" { "Reconciliation" }
                            a href="/consola/webhooks" { "Webhooks" }
                        }
                        form.logout method="post" action="/consola/logout" {
                            span.who { (who.name) " " span.role { (who.role) } }
                            input type="hidden" name="csrf" value=(who.csrf);
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// A state in words, with the class that colours it.
pub fn state_words(state: PaymentState) -> (&'static str, &'static str) {
    match state {
        PaymentState::EnProceso => ("Registered, not sent yet", "st-registered"),
        PaymentState::Enviada => ("Sent, outcome not known yet", "st-sent"),
        PaymentState::Completada => ("Paid", "st-paid"),
        PaymentState::Fallida => ("Failed, no money taken", "st-failed"),
        PaymentState::RevisionManual => ("Needs manual review", "st-review"),
    }
}

/// A refund's state in words, and the colour class of its badge.
pub fn refund_state_words(state: pagos_types::RefundState) -> (&'static str, &'static str) {
    use pagos_types::RefundState;
    match state {
        RefundState::EnProceso => ("Registered, not sent yet", "st-registered"),
        RefundState::Enviado => ("Sent, outcome not known yet", "st-sent"),
        RefundState::Completado => ("Refunded", "st-paid"),
        RefundState::Fallido => ("Refused, nothing returned", "st-failed"),
        RefundState::RevisionManual => ("Needs manual review", "st-review"),
    }
}

/// A refund's state as a coloured badge.
pub fn refund_badge(state: pagos_types::RefundState) -> Markup {
    let (words, class) = refund_state_words(state);
    html! {
        span class={ "badge " (class) } title=(state.as_str()) { (words) }
    }
}

/// A state as a coloured badge: its words, and its name as the API writes it.
pub fn state_badge(state: PaymentState) -> Markup {
    let (words, class) = state_words(state);
    html! {
        span class={ "badge " (class) } title=(state.as_str()) { (words) }
    }
}

/// An amount in minor units, written in major units with its currency: 250000 COP →
/// "2,500.00 COP". A currency pagos does not support (a provider's charge in another
/// one, shown to on-call to refund it by hand) is written with that currency's own
/// decimals, as the adapters read its amounts: ¥5,000 is "5,000 JPY", 5.000 KWD has three.
pub fn money(amount: i64, currency: &str) -> String {
    use crate::gateway::amount::{iso_exponent, stripe_exponent};
    let exponent = u32::from(iso_exponent(currency, stripe_exponent(currency)));
    let negative = amount < 0;
    let units = amount.unsigned_abs();
    let scale = 10u64.pow(exponent);
    let (whole, fraction) = (units / scale, units % scale);
    let digits = whole.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if negative { "-" } else { "" };
    if exponent == 0 {
        format!("{sign}{grouped} {currency}")
    } else {
        format!(
            "{sign}{grouped}.{fraction:0width$} {currency}",
            width = exponent as usize
        )
    }
}

/// An age as people say it: "40 s", "12 min", "3 h 5 min", "2 d 4 h".
pub fn age(age: TimeDelta) -> String {
    let seconds = age.num_seconds().max(0);
    let (d, h, m) = (
        seconds / 86_400,
        seconds % 86_400 / 3600,
        seconds % 3600 / 60,
    );
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3600 => format!("{m} min"),
        3600..86_400 if m == 0 => format!("{h} h"),
        3600..86_400 => format!("{h} h {m} min"),
        _ if h == 0 => format!("{d} d"),
        _ => format!("{d} d {h} h"),
    }
}

/// A time: UTC in the page, rewritten in the browser's zone by `hora.js`.
pub fn time(at: DateTime<Utc>) -> Markup {
    html! {
        time datetime=(at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)) {
            (at.format("%Y-%m-%d %H:%M:%S UTC"))
        }
    }
}

/// A relative time, for the next attempt: "in 4 min" / "4 min ago".
pub fn relative(at: DateTime<Utc>, now: DateTime<Utc>) -> String {
    if at >= now {
        format!("in {}", age(at - now))
    } else {
        format!("{} ago", age(now - at))
    }
}

/// A notice at the top of a page.
pub fn notice(kind: &str, text: &str) -> Markup {
    html! { p class={ "notice " (kind) } role="status" { (text) } }
}

/// Links to the previous and next page, keeping the other query parameters.
pub fn pager(base: &str, page: u64, has_next: bool, order: Order) -> Markup {
    let sep = if base.contains('?') { '&' } else { '?' };
    let (back, on) = match order {
        Order::NewestFirst => ("← Newer", "Older →"),
        Order::OldestFirst => ("← Older", "Newer →"),
    };
    html! {
        nav.pager {
            @if page > 1 {
                a href={ (base) (sep) "pagina=" (page - 1) } { (back) }
            }
            span { "Page " (page) }
            @if has_next {
                a href={ (base) (sep) "pagina=" (page + 1) } { (on) }
            }
        }
    }
}

/// How a paged list is sorted: what its pager's links lead to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The search: newest first, the next page older.
    NewestFirst,
    /// The attention queue: oldest first, the next page newer.
    OldestFirst,
}

/// What a form without a valid CSRF token gets.
pub const CSRF_REFUSED: &str =
    "This form was refused: it carried no valid CSRF token. Reload the page and try again.";

/// The CSS and script, embedded in the binary.
pub const CSS: &str = include_str!("assets/consola.css");
pub const SCRIPT: &str = include_str!("assets/hora.js");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pager_names_where_its_links_lead_in_the_lists_order() {
        let queue = pager("/consola/", 2, true, Order::OldestFirst).into_string();
        assert!(
            queue.contains("← Older") && queue.contains("Newer →"),
            "{queue}"
        );
        let search = pager("/consola/pagos?q=4", 2, true, Order::NewestFirst).into_string();
        assert!(
            search.contains("← Newer") && search.contains("Older →"),
            "{search}"
        );
    }

    #[test]
    fn amounts_are_in_major_units_with_their_currency() {
        assert_eq!(money(250_000, "COP"), "2,500.00 COP");
        assert_eq!(money(5, "USD"), "0.05 USD");
        assert_eq!(money(123_456_789, "EUR"), "1,234,567.89 EUR");
        assert_eq!(money(100, "MXN"), "1.00 MXN");
        // Charges in currencies pagos does not take, as providers report them.
        assert_eq!(money(5_000, "JPY"), "5,000 JPY");
        assert_eq!(money(5_000, "KWD"), "5.000 KWD");
        assert_eq!(money(5_000, "CHF"), "50.00 CHF");
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(TimeDelta::seconds(40)), "40 s");
        assert_eq!(age(TimeDelta::minutes(12)), "12 min");
        assert_eq!(age(TimeDelta::minutes(185)), "3 h 5 min");
        assert_eq!(age(TimeDelta::hours(2)), "2 h");
        assert_eq!(age(TimeDelta::hours(52)), "2 d 4 h");
        assert_eq!(age(TimeDelta::seconds(-3)), "0 s");
    }

    #[test]
    fn every_state_has_words_and_a_colour_of_its_own() {
        let all = [
            PaymentState::EnProceso,
            PaymentState::Enviada,
            PaymentState::Completada,
            PaymentState::Fallida,
            PaymentState::RevisionManual,
        ];
        let classes: std::collections::BTreeSet<_> =
            all.iter().map(|s| state_words(*s).1).collect();
        assert_eq!(classes.len(), all.len());
        for class in classes {
            assert!(CSS.contains(&format!(".{class}")), "{class} has a colour");
        }
    }

    #[test]
    fn names_from_the_database_are_escaped() {
        let who = Who {
            name: "<script>x</script>",
            role: "lector",
            csrf: "t",
        };
        let html = page("t", Some(&who), html! {}).into_string();
        assert!(!html.contains("<script>x"));
        assert!(html.contains("&lt;script&gt;"));
    }
}
