//! DNS on loopback for the tests: a port for a DNS server (dnsmasq), and
//! an A query to one.

use std::net::{TcpListener, UdpSocket};
use std::time::Duration;

/// A port free for both UDP and TCP on 127.0.0.1 (a DNS server binds both).
pub fn free_dns_port() -> u16 {
    for _ in 0..50 {
        let udp = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
        let port = udp.local_addr().expect("address").port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free for both UDP and TCP for the DNS server");
}

/// The address of the A record of `name` from the DNS server on `port`,
/// if it answers within a second with no error and one record.
pub fn query_a(port: u16, name: &str) -> Option<[u8; 4]> {
    let mut packet = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        packet.push(label.len() as u8);
        packet.extend_from_slice(label.as_bytes());
    }
    packet.extend_from_slice(&[0, 0, 1, 0, 1]);
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
    socket.set_read_timeout(Some(Duration::from_secs(1))).expect("timeout");
    socket.send_to(&packet, ("127.0.0.1", port)).ok()?;
    let mut answer = [0u8; 512];
    let n = socket.recv(&mut answer).ok()?;
    // No error, one answer, its address last.
    let ok = n >= 16 && answer[3] & 0x0f == 0 && answer[6..8] == [0, 1];
    ok.then(|| answer[n - 4..n].try_into().expect("four bytes"))
}
