//! Connections per client on one listener: how many each source address holds (an IPv6 client by
//! its /64, which one host usually has whole; an IPv4-mapped address as the IPv4 one), under a
//! cap, so one client cannot take every connection slot of the listener, stalled TLS handshakes
//! included. A connection holds its [`ClientSlot`] until it closes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// Who a connection counts against: an IPv4 address, or the first 64 bits of an IPv6 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum ClientKey {
    V4([u8; 4]),
    V6Prefix([u8; 8]),
}

impl ClientKey {
    pub(super) fn of(ip: IpAddr) -> ClientKey {
        match ip.to_canonical() {
            IpAddr::V4(v4) => ClientKey::V4(v4.octets()),
            IpAddr::V6(v6) => {
                let mut prefix = [0; 8];
                prefix.copy_from_slice(&v6.octets()[..8]);
                ClientKey::V6Prefix(prefix)
            }
        }
    }
}

/// The connections each client holds on one listener, and the most one may hold.
#[derive(Debug)]
pub(crate) struct Clients {
    cap: usize,
    held: Mutex<HashMap<ClientKey, usize>>,
}

/// One connection's place in its client's count; given back when dropped.
#[derive(Debug)]
pub(crate) struct ClientSlot {
    clients: Arc<Clients>,
    key: ClientKey,
}

impl Clients {
    pub(crate) fn new(cap: usize) -> Arc<Clients> {
        Arc::new(Clients {
            cap: cap.max(1),
            held: Mutex::default(),
        })
    }

    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    /// A slot for one more connection from `ip`, or `None` when that client holds the cap.
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let key = ClientKey::of(ip);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(key).or_insert(0);
        if *count >= self.cap {
            return None;
        }
        *count += 1;
        Some(ClientSlot {
            clients: self.clone(),
            key,
        })
    }

    /// Connections `ip`'s client holds now.
    #[cfg(test)]
    pub(crate) fn held_by(&self, ip: IpAddr) -> usize {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.get(&ClientKey::of(ip)).copied().unwrap_or(0)
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self
            .clients
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                // A client that holds nothing takes no memory.
                held.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_holds_at_most_the_cap_and_gets_its_slots_back() {
        let clients = Clients::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = clients.admit(a).unwrap();
        let _second = clients.admit(a).unwrap();
        assert!(
            clients.admit(a).is_none(),
            "a third connection from one client"
        );
        assert!(clients.admit(b).is_some(), "another client is not affected");
        drop(first);
        assert_eq!(clients.held_by(a), 1);
        assert!(clients.admit(a).is_some());
    }

    #[test]
    fn ipv6_clients_count_by_their_64_bit_prefix_and_mapped_ipv4_as_ipv4() {
        let clients = Clients::new(1);
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_prefix: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let other_prefix: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let _held = clients.admit(one).unwrap();
        assert!(clients.admit(same_prefix).is_none());
        assert!(clients.admit(other_prefix).is_some());
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        let _v4 = clients.admit(v4).unwrap();
        assert!(clients.admit(mapped).is_none());
    }

    #[test]
    fn a_client_that_holds_nothing_is_forgotten() {
        let clients = Clients::new(3);
        for n in 0..100u8 {
            drop(clients.admit(IpAddr::from([10, 0, 0, n])).unwrap());
        }
        assert!(clients.held.lock().unwrap().is_empty());
    }
}
