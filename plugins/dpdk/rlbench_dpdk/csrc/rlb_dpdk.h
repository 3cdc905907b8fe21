/* rlbench's C shim over DPDK: ports, links and a reliable message layer on Ethernet/IPv4/UDP frames.
 *
 * A port is one DPDK ethdev (memif, af_packet, af_xdp or a NIC), opened by hot-plugging devargs.
 * A link is one conversation over a port: a client's connection, or one peer of a listener.
 * Messages are cut into frames with a per-link frame sequence number; the receiver accepts frames
 * strictly in order and acknowledges cumulatively (piggybacked on its own frames, or in ACK frames),
 * the sender keeps unacknowledged frames and goes back to the first unacknowledged one on a gap
 * report or a timeout (go-back-N). Every call that waits polls, then yields, then sleeps briefly,
 * so pollers sharing a core do not stall each other.
 *
 * The receiving side never trusts a frame: a message over the link's max_message bytes is refused
 * before anything is allocated for it, a message being reassembled holds only the bytes that arrived
 * (its buffer grows as they do, never to the length the sender claims), and a peer whose frames break
 * the protocol, claim too much, or stop mid-message is dropped (told why in its goodbye) and counted.
 *
 * A listener's send never waits on its peer: what the link's window cannot take now is copied into
 * the link's queue and framed as the peer acknowledges, during the listener's later calls (recv,
 * send); a peer whose queue would pass the listener's max_queued bytes is dropped (a slow consumer).
 * A client's send waits for window room.
 *
 * Every function returns >= 0 on success or a negative errno; rlb_last_error() says more. */
#ifndef RLB_DPDK_H
#define RLB_DPDK_H
#include <stdint.h>

/* Counters of rlb_link_stats / rlb_listener_stats, in this order: messages_sent messages_received
 * bytes_sent bytes_received lost frames_sent frames_received retransmits acks_sent gap_reports
 * duplicates out_of_order malformed tx_full_waits refused_oversize dropped_peers refused_peers
 * slow_consumers (rlbench_dpdk.native.STAT_NAMES). */
#define RLB_STATS_N 18

/* The wire: frame kinds, header flags, and why a link ended (a goodbye carries C_OVERSIZE, C_MALFORMED,
 * C_STALLED or C_SLOW when its sender dropped the peer; the peer keeps C_PEER_DROPPED + that reason).
 * C_CLOSED: this side's application dropped the peer (rlb_listener_drop); its goodbye is a plain one. */
enum { K_DATA = 1, K_ACK = 2, K_HELLO = 3, K_WELCOME = 4, K_BYE = 5, K_LAST = 5 };
enum { F_TO_LISTENER = 1, F_GAP = 2, F_ACK_REQ = 4, F_ALL = 7 };
enum { C_BYE = 1, C_SILENT = 2, C_DOWN = 3, C_OVERSIZE = 4, C_MALFORMED = 5, C_STALLED = 6, C_SLOW = 7,
       C_PEER_DROPPED = 8, C_CLOSED = 16 };

int rlb_init(const char *eal_args);
const char *rlb_last_error(void);
const char *rlb_version(void);
int rlb_port_count(void);
/* mtu: the largest IP packet this shim builds on the port; device_mtu: what the ethdev itself reports
 * (memif's PMD has no MTU of its own and stays at 1500 whatever frames it carries). */
int rlb_port_info(int port, char *driver, int driver_cap, uint32_t *mtu, uint32_t *frame_payload, int *link_up,
                  uint32_t *device_mtu);

int rlb_port_open(const char *devargs, uint32_t mtu);
int rlb_port_close(int port);

/* max_message: the longest message accepted from any peer; give_up_ns: how long a peer may leave
 * frames unacknowledged, stop in the middle of a message, or (memif) hold an interface without
 * saying hello, before it is declared gone; max_queued: the bytes a peer's send queue may hold
 * behind its window (a message into an empty queue is always taken). rlb_connect takes the first
 * two for its one link.
 *
 * rlb_listener_send returns -ENOBUFS when it dropped the peer as a slow consumer, -ENOTCONN for a
 * peer gone (or dropped before). rlb_listener_peers returns how many peers are connected (it fills
 * at most `cap` of them). rlb_listener_drop ends one peer's link (why: 0, or C_OVERSIZE, C_MALFORMED,
 * C_STALLED or C_SLOW to count it as that fault and tell the peer so). */
int rlb_listener_new(uint32_t token, uint32_t max_message, uint64_t give_up_ns, uint64_t max_queued);
int rlb_listener_add_port(int listener, int port);
int64_t rlb_listener_recv(int listener, uint64_t timeout_ns, int *peer, uint8_t **data);
int rlb_listener_send(int listener, int peer, const uint8_t *const *parts, const uint32_t *lens, int nparts);
int rlb_listener_peers(int listener, int *out, int cap);
int rlb_listener_drop(int listener, int peer, int why);
void rlb_listener_stats(int listener, uint64_t *out);
void rlb_listener_close(int listener);

int rlb_connect(int port, uint32_t token, uint64_t timeout_ns, uint32_t max_message, uint64_t give_up_ns);
int rlb_send(int link, const uint8_t *const *parts, const uint32_t *lens, int nparts);
int64_t rlb_recv(int link, uint64_t timeout_ns, uint8_t **data);
int64_t rlb_request(int link, const uint8_t *const *parts, const uint32_t *lens, int nparts, uint64_t timeout_ns,
                    uint8_t **data);
void rlb_link_stats(int link, uint64_t *out);
void rlb_link_close(int link);

/* Raw frames on a port that carries no link, for tests of what a buggy or hostile peer can send:
 * rlb_raw_frame builds one frame with the header fields given (they may lie: frag_len is what the
 * header claims, payload_len what follows it) and returns its length; rlb_raw_send transmits any
 * bytes as one frame (1 sent, 0 ring full); rlb_raw_recv takes one received frame, returns its length
 * (0: none) and sets *kind to its rlbench frame kind (-1: not an rlbench frame) and *reason to a
 * goodbye's reason code. */
int rlb_raw_frame(int port, int kind, int flags, uint32_t conn, uint32_t token, uint32_t fseq, uint32_t ack,
                  uint32_t msg_len, uint32_t offset, uint32_t frag_len, const uint8_t *payload, uint32_t payload_len,
                  uint8_t *out, uint32_t cap);
int rlb_raw_send(int port, const uint8_t *frame, uint32_t len);
int rlb_raw_recv(int port, uint8_t *out, uint32_t cap, int *kind, int *reason);
uint64_t rlb_now_ns(void);
#endif
