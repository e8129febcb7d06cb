//! Per-client shares of the receiver's in-flight budgets: one client (an IP
//! address) cannot take the whole budget from the others.
//!
//! A lone client may use all of it, as one exporter or a load-balancing
//! tier in front of the collectors must. Once another client has come in
//! the last [`RECENT`], a client that holds more than half of a budget
//! (requests in flight, or KiB of their bodies) may not take from its last
//! quarter: that part is kept for the others, which are refused only when
//! the budget itself runs out. A client refused while a hog held everything
//! counts as come, so the hog is held to its share from then on, and the
//! others get in as soon as the hog's requests end (a slow upload is cut
//! off after its grace, server.rs). The ledger holds one entry per client
//! with something in flight, so it is bounded by the budget itself.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a client counts as one of several after its last request.
const RECENT: Duration = Duration::from_secs(30);

/// The peer address of an HTTP request, set by the listener on every
/// request of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub IpAddr);

/// What each client holds of the in-flight budgets.
pub struct Fairness {
    requests_total: usize,
    kib_total: usize,
    held: Mutex<Ledger>,
}

#[derive(Default)]
struct Ledger {
    held: HashMap<IpAddr, Held>,
    /// The two clients seen last, newest first, and when: enough to know
    /// whether a client other than the one asking came recently.
    recent: [Option<(IpAddr, Instant)>; 2],
}

impl Ledger {
    /// Notes `ip` as seen now; whether another client came within [`RECENT`].
    fn seen(&mut self, ip: IpAddr, now: Instant) -> bool {
        if self.recent[0].is_none_or(|(last, _)| last != ip) {
            self.recent[1] = self.recent[0];
        }
        self.recent[0] = Some((ip, now));
        self.recent[1].is_some_and(|(other, at)| other != ip && now.duration_since(at) < RECENT)
    }
}

#[derive(Default, Clone, Copy)]
struct Held {
    requests: usize,
    kib: usize,
}

/// A client's hold on its share; given back when dropped.
pub struct ClientHold<'a> {
    fairness: &'a Fairness,
    ip: IpAddr,
    kib: usize,
}

impl Fairness {
    pub fn new(requests_total: usize, kib_total: usize) -> Fairness {
        Fairness {
            requests_total,
            kib_total,
            held: Mutex::new(Ledger::default()),
        }
    }

    /// Admits one more request of `kib` from `ip`, given what the budgets
    /// have free now; or says which share the client is over.
    pub fn admit(&self, ip: IpAddr, kib: usize, free_requests: usize, free_kib: usize) -> Result<ClientHold<'_>, &'static str> {
        self.admit_at(ip, kib, free_requests, free_kib, Instant::now())
    }

    fn admit_at(
        &self,
        ip: IpAddr,
        kib: usize,
        free_requests: usize,
        free_kib: usize,
        now: Instant,
    ) -> Result<ClientHold<'_>, &'static str> {
        let mut ledger = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let others = ledger.seen(ip, now);
        let held = &mut ledger.held;
        let have = held.get(&ip).copied().unwrap_or_default();
        let over =
            |have: usize, want: usize, total: usize, free: usize| others && have + want > total / 2 && free < total.div_ceil(4) + want;
        if over(have.requests, 1, self.requests_total, free_requests) {
            return Err("this client has more than half of the receiver's requests in flight while others may need the rest");
        }
        if over(have.kib, kib, self.kib_total, free_kib) {
            return Err("this client has more than half of the receiver's in-flight bytes while others may need the rest");
        }
        let entry = held.entry(ip).or_default();
        entry.requests += 1;
        entry.kib += kib;
        Ok(ClientHold { fairness: self, ip, kib })
    }

    /// Clients with something in flight.
    pub fn clients(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).held.len()
    }
}

impl Drop for ClientHold<'_> {
    fn drop(&mut self) {
        let mut ledger = self.fairness.held.lock().unwrap_or_else(|e| e.into_inner());
        let held = &mut ledger.held;
        if let Some(h) = held.get_mut(&self.ip) {
            h.requests = h.requests.saturating_sub(1);
            h.kib = h.kib.saturating_sub(self.kib);
            if h.requests == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lone_client_may_use_the_whole_budget() {
        let f = Fairness::new(16, 1 << 20);
        let lone: IpAddr = "10.0.0.1".parse().unwrap();
        let holds: Vec<_> = (0..16)
            .map(|n| f.admit(lone, 1, 16 - n, 1 << 20).expect("no one else came"))
            .collect();
        assert_eq!(holds.len(), 16);
    }

    #[test]
    fn with_others_about_a_client_leaves_a_quarter_to_them() {
        let f = Fairness::new(16, 1 << 20);
        let hog: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        drop(f.admit(other, 1, 16, 1 << 20).unwrap());
        let mut holds = Vec::new();
        let mut free = 16;
        while let Ok(h) = f.admit(hog, 1, free, 1 << 20) {
            holds.push(h);
            free -= 1;
        }
        assert_eq!(holds.len(), 12, "past half, the hog stops where a quarter is left");
        // Another client still gets in, down to the last request.
        let mut others = Vec::new();
        while free > 0 {
            others.push(f.admit(other, 1, free, 1 << 20).expect("the others' quarter"));
            free -= 1;
        }
        assert_eq!(others.len(), 4);
        assert_eq!(f.clients(), 2);
        drop(holds);
        drop(others);
        assert_eq!(f.clients(), 0, "the ledger holds only clients with something in flight");
    }

    #[test]
    fn bytes_are_shared_the_same_way() {
        let f = Fairness::new(64, 1024);
        let hog: IpAddr = "::1".parse().unwrap();
        drop(f.admit("10.1.1.1".parse().unwrap(), 1, 64, 1024).unwrap());
        let _big = f.admit(hog, 600, 64, 1024).expect("over half, but three quarters free");
        let e = f.admit(hog, 200, 63, 424).err().expect("refused: the last quarter is kept");
        assert!(e.contains("in-flight bytes"), "{e}");
        assert!(f.admit("10.1.1.1".parse().unwrap(), 200, 63, 424).is_ok());
    }

    #[test]
    fn others_stop_counting_after_a_while() {
        let f = Fairness::new(4, 1024);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        drop(f.admit_at(b, 1, 4, 1024, t0).unwrap());
        let _held: Vec<_> = (0..3).map(|n| f.admit_at(a, 1, 4 - n, 1024, t0).unwrap()).collect();
        assert!(f.admit_at(a, 1, 1, 1024, t0).is_err(), "b came just now");
        assert!(f.admit_at(a, 1, 1, 1024, t0 + RECENT).is_ok(), "b has not come for a while");
    }
}
