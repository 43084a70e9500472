// Bring-up stub of the kv_epilogue interface (NOT the codec).
//
// Same ports and stream rules as the real RTL (hw/, rtl_gen/):
//   o__payload = codes | scales << (N*B) | flags << (N*B + 8*N/G)
// but the payload here is simply the low OW bits of the input payload (the
// "codes" are garbage w.r.t. the golden model). The testbench knows this
// identity model ("stub" model) so the driver/monitor/scoreboard plumbing can
// be brought up with zero mismatches; checked against the golden model the
// stub must fail (a negative test of the scoreboard).
//
// LAT register stages with one global enable: latency LAT cycles, 1 vector/cycle.
// status: sticky OR of the flags of transferred output words, registered;
// cleared by rst or status_clear.
`default_nettype none
module kv_epilogue #(
    parameter integer N = 128,
    parameter integer B = 3,
    parameter integer G = 64,
    parameter integer LAT = 1
) (
    input  wire                       clk,
    input  wire                       rst,
    input  wire                       i__valid,
    output wire                       i__ready,
    input  wire [N*16-1:0]            i__payload,
    output wire                       o__valid,
    input  wire                       o__ready,
    output wire [N*B+8*(N/G)+3-1:0]   o__payload,
    output reg  [2:0]                 status,
    input  wire                       status_clear
);
    localparam integer OW = N*B + 8*(N/G) + 3;
    reg [LAT-1:0] v;
    reg [OW-1:0]  d [0:LAT-1];
    wire en = ~v[LAT-1] | o__ready;
    assign i__ready = en;
    assign o__valid = v[LAT-1];
    assign o__payload = d[LAT-1];
    integer k;
    always @(posedge clk) begin
        if (en) begin
            v[0] <= i__valid;
            d[0] <= i__payload[OW-1:0];
            for (k = 1; k < LAT; k = k + 1) begin
                v[k] <= v[k-1];
                d[k] <= d[k-1];
            end
        end
        if (rst) v <= {LAT{1'b0}};
    end
    always @(posedge clk) begin
        if (rst | status_clear)
            status <= 3'b000;
        else if (o__valid & o__ready)
            status <= status | o__payload[OW-1:OW-3];
    end
endmodule
`default_nettype wire
