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
 * Every function returns >= 0 on success or a negative errno; rlb_last_error() says more. */
#ifndef RLB_DPDK_H
#define RLB_DPDK_H
#include <stdint.h>

/* Counters of rlb_link_stats / rlb_listener_stats, in this order: messages_sent messages_received
 * bytes_sent bytes_received lost frames_sent frames_received retransmits acks_sent gap_reports
 * duplicates out_of_order malformed tx_full_waits (rlbench_dpdk.native.STAT_NAMES). */
#define RLB_STATS_N 14

int rlb_init(const char *eal_args);
const char *rlb_last_error(void);
const char *rlb_version(void);
int rlb_port_count(void);
int rlb_port_info(int port, char *driver, int driver_cap, uint32_t *mtu, uint32_t *frame_payload, int *link_up);

int rlb_port_open(const char *devargs, uint32_t mtu);
int rlb_port_close(int port);

int rlb_listener_new(uint32_t token);
int rlb_listener_add_port(int listener, int port);
int64_t rlb_listener_recv(int listener, uint64_t timeout_ns, int *peer, uint8_t **data);
int rlb_listener_send(int listener, int peer, const uint8_t *const *parts, const uint32_t *lens, int nparts);
int rlb_listener_peers(int listener, int *out, int cap);
void rlb_listener_stats(int listener, uint64_t *out);
void rlb_listener_close(int listener);

int rlb_connect(int port, uint32_t token, uint64_t timeout_ns);
int rlb_send(int link, const uint8_t *const *parts, const uint32_t *lens, int nparts);
int64_t rlb_recv(int link, uint64_t timeout_ns, uint8_t **data);
int64_t rlb_request(int link, const uint8_t *const *parts, const uint32_t *lens, int nparts, uint64_t timeout_ns,
                    uint8_t **data);
void rlb_link_stats(int link, uint64_t *out);
void rlb_link_close(int link);

void rlb_set_timing(uint64_t rto_ns, uint64_t give_up_ns);
uint64_t rlb_now_ns(void);
#endif
