//! Hosts on one LAN, on one machine: each "host" a network namespace with its own address,
//! all joined by a bridge in a switch namespace of its own, and this test process on the same
//! segment through one more link (so it reaches every host). Daemons run on a host through
//! `nsenter --net` (network only: the mounts, cgroups and pids stay the machine's). Traffic
//! from one host to another can be dropped silently and let through again (a partition
//! between them, with the rest of the LAN, this process included, still reaching both).
//! Everything is removed when dropped.

use std::net::Ipv4Addr;

use crate::remote::{ip, ip_quiet};

/// A LAN of network namespaces, `198.18.SLOT.0/24`.
#[derive(Debug)]
pub struct Lan {
    prefix: String,
    slot: u8,
    hosts: u8,
}

impl Lan {
    /// `hosts` hosts at `198.18.SLOT.1` and up, this process at `198.18.SLOT.254`. Slots
    /// keep concurrent tests apart (10 to 63; the egress tests use lower ones).
    pub fn create(slot: u8, hosts: u8) -> Self {
        assert!((10..64).contains(&slot) && hosts < 200, "slot 10..63");
        let lan = Self {
            prefix: format!("tgfl{slot}"),
            slot,
            hosts,
        };
        lan.remove();
        let switch = lan.switch();
        ip(&["netns", "add", &switch]);
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &switch, "link", "set", "br0", "up"]);
        for host in 0..hosts {
            let netns = lan.host(host);
            let (inside, port) = (format!("{netns}a"), format!("{netns}b"));
            ip(&["netns", "add", &netns]);
            ip(&[
                "link", "add", &inside, "type", "veth", "peer", "name", &port,
            ]);
            ip(&["link", "set", &inside, "netns", &netns]);
            ip(&["-n", &netns, "link", "set", &inside, "name", "eth0"]);
            ip(&["link", "set", &port, "netns", &switch]);
            ip(&["-n", &switch, "link", "set", &port, "master", "br0", "up"]);
            let address = format!("{}/24", lan.address(host));
            ip(&["-n", &netns, "addr", "add", &address, "dev", "eth0"]);
            ip(&["-n", &netns, "link", "set", "eth0", "up"]);
            ip(&["-n", &netns, "link", "set", "lo", "up"]);
        }
        let (here, port) = (format!("{}x", lan.prefix), format!("{}y", lan.prefix));
        ip(&["link", "add", &here, "type", "veth", "peer", "name", &port]);
        ip(&["link", "set", &port, "netns", &switch]);
        ip(&["-n", &switch, "link", "set", &port, "master", "br0", "up"]);
        let address = format!("198.18.{slot}.254/24");
        ip(&["addr", "add", &address, "dev", &here]);
        ip(&["link", "set", &here, "up"]);
        lan
    }

    fn switch(&self) -> String {
        format!("{}sw", self.prefix)
    }

    /// The network namespace of host `index`.
    pub fn host(&self, index: u8) -> String {
        format!("{}h{index}", self.prefix)
    }

    /// Host `index`'s address.
    pub fn address(&self, index: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, self.slot, index + 1)
    }

    /// The command prefix that runs a program on host `index` (its network only).
    pub fn on(&self, index: u8) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--net=/run/netns/{}", self.host(index)),
            "--".into(),
        ]
    }

    /// Drops (`cut`) or lets through again what host `from` sends to host `to`: a blackhole
    /// route, so packets vanish without an answer, as on a link that went silent.
    pub fn partition(&self, from: u8, to: u8, cut: bool) {
        let target = format!("{}/32", self.address(to));
        let action = if cut { "add" } else { "del" };
        ip(&[
            "-n",
            &self.host(from),
            "route",
            action,
            "blackhole",
            &target,
        ]);
    }

    fn remove(&self) {
        for host in 0..self.hosts {
            ip_quiet(&["netns", "del", &self.host(host)]);
        }
        ip_quiet(&["netns", "del", &self.switch()]);
        ip_quiet(&["link", "del", &format!("{}x", self.prefix)]);
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        self.remove();
    }
}
