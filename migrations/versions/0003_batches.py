"""batches: the batches table, jobs.batch_id and jobs.admitted_at

Revision ID: 0003_batches
Revises: 0001
Create Date: 2026-12-01 20:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0003_batches'
down_revision = '0002_recipes'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'batches',
        sa.Column('id', sa.String(length=32), nullable=False),
        sa.Column('station_id', sa.String(length=32), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('recipes', sa.JSON(), nullable=False),
        sa.Column('priority', sa.String(length=16), nullable=False),
        sa.Column('not_before', sa.DateTime(timezone=True), nullable=True),
        sa.Column('not_after', sa.DateTime(timezone=True), nullable=True),
        sa.Column('on_window_end', sa.String(length=8), nullable=True),
        sa.Column('webhook_url', sa.String(length=2000), nullable=True),
        sa.Column('webhook_secret', sa.String(length=128), nullable=True),
        sa.Column('webhook_attempts', sa.Integer(), nullable=False),
        sa.Column('webhook_status', sa.String(length=200), nullable=True),
        sa.Column('webhook_delivered_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['station_id'], ['stations.id']),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_batches_station_id'), ['station_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_batches_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_batches_created_at'), ['created_at'], unique=False)
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('batch_id', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('admitted_at', sa.DateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_batch_id'), ['batch_id'], unique=False)
        batch_op.create_foreign_key('fk_jobs_batch_id_batches', 'batches', ['batch_id'], ['id'])
    # Jobs from before admission existed were all sent to the queue when created.
    op.execute("UPDATE jobs SET admitted_at = created_at")


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint('fk_jobs_batch_id_batches', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_jobs_batch_id'))
        batch_op.drop_column('admitted_at')
        batch_op.drop_column('batch_id')
    with op.batch_alter_table('batches', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_batches_created_at'))
        batch_op.drop_index(batch_op.f('ix_batches_status'))
        batch_op.drop_index(batch_op.f('ix_batches_station_id'))
    op.drop_table('batches')
